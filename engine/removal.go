package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// A rule removed from the set — while syncloop runs, or while it was down
// (its newest revision says what it was) — is let go of once: the
// triggers it held for an ordered teardown lose its finalizer, and with
// removalPolicy: Delete its children are deleted, dependents first, unless
// they are more than its rollout.maxPrunes: a rule file removed by
// mistake must not empty a cluster. What the removal did is recorded on
// the rule's newest revision (RolloutStore.RecordRemoval), so it is done
// once, and a halted removal is not tried again: putting the rule back
// with a higher maxPrunes, then removing it, confirms it.

// The states of a removal (RemovalRecord.State).
const (
	// RemovalDone: the removal did all the rule asked.
	RemovalDone = "Removed"
	// RemovalHalted: the children were more than maxPrunes; none was
	// deleted.
	RemovalHalted = "Halted"
)

// RemovalRecord is what removing a rule did.
type RemovalRecord struct {
	State string    `json:"state"`
	At    time.Time `json:"at"`
	// Children is how many children the rule had; Deleted how many the
	// removal deleted; Released how many triggers it took the teardown
	// finalizer off.
	Children int    `json:"children"`
	Deleted  int    `json:"deleted"`
	Released int    `json:"released"`
	Message  string `json:"message,omitempty"`
}

// removals are the removals under way, by rule.
type removals struct {
	mu sync.Mutex
	// inForce are the rules of the set in force; closed: the engine is
	// stopping, and starts no removal.
	inForce map[string]*rules.Rule
	closed  bool
	running map[string]context.CancelFunc
	wg      sync.WaitGroup
}

// setInForce records the rules in force, and cancels the removal of each
// (wanted again: its loop makes what it wants). A nil set cancels every
// removal and waits for them to end.
func (rs *removals) setInForce(want map[string]*rules.Rule, set *rules.Set) {
	rs.mu.Lock()
	rs.inForce, rs.closed = want, set == nil
	for name, cancel := range rs.running {
		if _, wanted := want[name]; wanted || set == nil {
			cancel()
		}
	}
	rs.mu.Unlock()
	if set == nil {
		rs.wg.Wait()
	}
}

// startRemovals asks the store which rules set no longer holds have a
// removal to do, and does each not under way already, in the background.
// A rule wanted again before its removal begins is not removed.
func (e *Engine) startRemovals(ctx context.Context, set *rules.Set) {
	if e.rollouts == nil {
		return
	}
	rs := &e.removals
	rs.wg.Go(func() {
		removed, err := e.rollouts.Removed(ctx, set)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Reading which rules were removed")
			return
		}
		rs.mu.Lock()
		defer rs.mu.Unlock()
		for _, r := range removed {
			if _, wanted := rs.inForce[r.Name]; wanted || rs.closed || rs.running[r.Name] != nil || ctx.Err() != nil {
				continue
			}
			rctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("rule", r.Name)))
			rs.running[r.Name] = cancel
			rs.wg.Go(func() {
				defer func() {
					rs.mu.Lock()
					delete(rs.running, r.Name)
					rs.mu.Unlock()
					cancel()
				}()
				e.remove(rctx, r)
			})
		}
	})
}

// remove lets go of the removed rule r and records what it did — unless
// it was cancelled (the rule is wanted again), failed (tried again at the
// next change of the set), or is a dry run.
func (e *Engine) remove(ctx context.Context, r *rules.Rule) {
	logger := klog.FromContext(ctx)
	rec, err := func() (rec RemovalRecord, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = contained(logger, e.metrics, r.Name, PanicLoop, v)
			}
		}()
		return e.removeRule(ctx, r)
	}()
	switch {
	case ctx.Err() != nil:
		return
	case err != nil:
		logger.Error(err, "Removing a rule")
		return
	}
	rec.At = time.Now().Truncate(time.Second)
	eventType, reason := corev1.EventTypeNormal, "Removed"
	if rec.State == RemovalHalted {
		eventType, reason = corev1.EventTypeWarning, "RemovalHalted"
		logger.Info("Removal halted: the rule's children are left", "children", rec.Children, "why", rec.Message)
	} else if rec.Deleted+rec.Released > 0 {
		logger.Info("Removed the rule", "deleted", rec.Deleted, "released", rec.Released)
	}
	e.out.removed(ctx, r, rec, eventType, reason)
}

// removeRule does r's removal: the teardown finalizer off its triggers,
// and with removalPolicy: Delete its children deleted within maxPrunes,
// through the rule's writer (a dry run plans the deletes).
func (e *Engine) removeRule(ctx context.Context, r *rules.Rule) (RemovalRecord, error) {
	rec := RemovalRecord{State: RemovalDone}
	a, err := e.actors.of(r.Identity)
	if err != nil {
		return rec, err
	}
	out := e.out.writer(r, "", a.client, newOwnWrites(), func(cache.ObjectName) {})
	if rec.Released, err = e.releaseRemoved(ctx, r, a, out); err != nil || r.RemovalPolicy != rules.DeletionDelete {
		return rec, err
	}
	doomed, err := e.childrenOfRemoved(ctx, r, a)
	if err != nil {
		return rec, err
	}
	rec.Children = len(doomed)
	if budget := r.Rollout.MaxPrunes.Of(len(doomed)); len(doomed) > budget {
		rec.State = RemovalHalted
		rec.Message = fmt.Sprintf("removing rule %s would delete its %d children, more than rollout.maxPrunes (%s, %d) allows: none deleted. Put the rule back with a higher maxPrunes, then remove it, to delete them",
			r.Name, len(doomed), r.Rollout.MaxPrunes, budget)
		return rec, nil
	}
	rank := func(u *unstructured.Unstructured) int {
		if res := r.Resource(rules.Annotation(u, rules.AnnotationResourceID)); res != nil {
			return res.Rank
		}
		return len(r.Order)
	}
	slices.SortStableFunc(doomed, func(a, b removedChild) int { return rank(b.obj) - rank(a.obj) })
	var errs []error
	for _, c := range doomed {
		if ctx.Err() != nil {
			return rec, ctx.Err()
		}
		trigger, _ := rules.ParseOwner(rules.Annotation(c.obj, rules.AnnotationOwner))
		ref := rules.ObjectRef{APIVersion: trigger.APIVersion, Kind: trigger.Kind, Namespace: trigger.Namespace, Name: trigger.Name}
		if err := out.delete(ctx, c.mapping, ref, c.obj, &changes{}, metav1.DeletePropagationBackground); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", c.obj.GetKind(), cacheKey(refOf(c.obj)), err))
			continue
		}
		rec.Deleted++
	}
	return rec, errors.Join(errs...)
}

// removedChild is a child of a removed rule, with its kind's mapping.
type removedChild struct {
	obj     *unstructured.Unstructured
	mapping *meta.RESTMapping
}

// namespaceOf is where a removed rule's objects of a namespaced kind are
// looked for: its tenant's namespace, the engine's, or everywhere ("").
func (e *Engine) namespaceOf(r *rules.Rule, m *meta.RESTMapping) string {
	if !namespaced(m) {
		return ""
	}
	return cmp.Or(r.Tenant, e.ns)
}

// releaseRemoved takes the removed rule's teardown finalizer off every
// trigger that holds it, and returns how many.
func (e *Engine) releaseRemoved(ctx context.Context, r *rules.Rule, a *actor, out writer) (int, error) {
	m, err := e.mapper.Mapping(ctx, r.Watch.GVK)
	if err != nil {
		return 0, err
	}
	ns := e.namespaceOf(r, m)
	if namespaced(m) && r.Watch.Namespace != "" {
		ns = r.Watch.Namespace // all a rule confined there may list
	}
	list, err := a.client.Client.Dynamic.Resource(m.Resource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("listing the rule's triggers: %w", err)
	}
	finalizer, n := r.TeardownFinalizer(), 0
	var errs []error
	for i := range list.Items {
		t := &list.Items[i]
		if !slices.Contains(t.GetFinalizers(), finalizer) {
			continue
		}
		if err := out.unfinalize(ctx, m, t, finalizer); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("taking the finalizer off %s: %w", cacheKey(refOf(t)), err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// childrenOfRemoved lists the removed rule's children that removing it
// deletes: every object of its kinds carrying its ownership marks — as
// mayPrune asks of any delete — but those of an Orphan resource and those
// a lookup of the rule reads by name.
func (e *Engine) childrenOfRemoved(ctx context.Context, r *rules.Rule, a *actor) ([]removedChild, error) {
	selector := childrenSelector(r.Installation) + "," + rules.LabelRule + "=" + r.Name
	var out []removedChild
	for _, k := range r.ChildKinds() {
		m, err := e.mapper.Mapping(ctx, k.GVK)
		if err != nil {
			return nil, err
		}
		list, err := a.client.Client.Dynamic.Resource(m.Resource).Namespace(e.namespaceOf(r, m)).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, fmt.Errorf("listing the rule's %s children: %w", k.Kind, err)
		}
		for i := range list.Items {
			c := &list.Items[i]
			owner := rules.Annotation(c, rules.AnnotationOwner)
			policy := r.DeletionPolicy
			if res := r.Resource(rules.Annotation(c, rules.AnnotationResourceID)); res != nil {
				policy = res.DeletionPolicy
			}
			if owner == "" || policy == rules.DeletionOrphan || !mayPrune(r.Name, owner, c, nil) || readByLiteral(r, c) {
				continue
			}
			out = append(out, removedChild{obj: c, mapping: m})
		}
	}
	return out, nil
}

// readByLiteral reports whether a lookup of r reads obj by its literal
// name: a source, never deleted (see reconciler.readByLookup).
func readByLiteral(r *rules.Rule, obj object) bool {
	gk := obj.GetObjectKind().GroupVersionKind().GroupKind()
	return slices.ContainsFunc(r.Lookups, func(l *rules.Lookup) bool {
		return !l.List() && l.GVK.GroupKind() == gk && readsLiterally(l, obj)
	})
}
