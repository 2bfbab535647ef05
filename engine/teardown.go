package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// An ordered teardown (rules.TeardownOrdered): while a trigger has
// children, the rule's finalizer holds it; once it is being deleted, its
// reconciles delete its children wave by wave (rules.Resource.Wave),
// dependents first — each wave only once the one before is gone from the
// caches — and take the finalizer off last. Every step is read from the
// caches again, so a restart, a handover or a failed request resumes the
// teardown where it stands.

// letGo lets go of a trigger being deleted: its children are torn down in
// waves while the rule's finalizer holds it, or pruned at once (release)
// when the rule does not order its teardown (any more); the finalizer
// comes off when no child is left.
func (rc *reconciler) letGo(ctx context.Context, ch *changes, ref rules.ObjectRef, key cache.ObjectName, owner string, existing []object, trigger *unstructured.Unstructured) error {
	finalizer := rc.rule.TeardownFinalizer()
	if !slices.Contains(trigger.GetFinalizers(), finalizer) {
		return rc.release(ctx, ch, ref, key, owner, existing)
	}
	if !rc.rule.OrdersTeardown() {
		if err := rc.release(ctx, ch, ref, key, owner, existing); err != nil {
			return err
		}
		return rc.unhold(ctx, key, trigger)
	}
	rc.deps.set(key, nil)
	rc.writes.forgetConflicts(key)
	doomed := rc.prunable(ctx, owner, existing, nil, nil, true)
	remote, waitingFor := rc.remoteDoomed(ctx, owner)
	if len(doomed) > 0 || len(remote) > 0 {
		return rc.tearDown(ctx, ch, ref, trigger, doomed, remote)
	}
	if len(waitingFor) > 0 {
		// Held until every cluster where it may have children answers (or
		// leaves the inventory): none of them is left behind unseen.
		err := &ClusterWaitError{Clusters: waitingFor}
		if rc.rule.WritesStatus() {
			return errors.Join(err, rc.applyStatus(ctx, trigger, nil, render.TearingDown(err.Error()), nil))
		}
		return err
	}
	// What the trigger patched is released last: its dependents are gone.
	if err := rc.releasePatches(ctx, ch, ref, key, nil, nil); err != nil {
		return err
	}
	rc.patches.setKeys(key, nil)
	return rc.unhold(ctx, key, trigger)
}

// tearDown deletes the children of the earliest wave doomed and remote
// (per cluster) hold — those not being deleted already — and says on the
// trigger which wave its deletion waits on. The children's deletes queue
// the trigger again.
func (rc *reconciler) tearDown(ctx context.Context, ch *changes, ref rules.ObjectRef, trigger *unstructured.Unstructured, doomed []object, remote map[*place][]object) error {
	wave := -1
	places := make([]*place, 0, len(remote))
	for _, objs := range append([][]object{doomed}, slices.Collect(maps.Values(remote))...) {
		for _, child := range objs {
			if w := waveOf(rc.rule, child); wave < 0 || w < wave {
				wave = w
			}
		}
	}
	for p := range remote {
		places = append(places, p)
	}
	slices.SortFunc(places, func(a, b *place) int { return strings.Compare(a.cluster, b.cluster) })
	names, deleted, errs := rc.deleteWave(ctx, ch, ref, doomed, wave, "")
	for _, p := range places {
		n, d, e := p.rc.deleteWave(ctx, ch, ref, remote[p], wave, " in cluster "+p.cluster)
		names, deleted, errs = append(names, n...), deleted+d, append(errs, e...)
		p.noAnswer(ctx, errors.Join(e...))
	}
	slices.Sort(names)
	msg := fmt.Sprintf("deleting wave %d of %d: %s", wave+1, rc.rule.Waves(), strings.Join(names, ", "))
	if deleted > 0 {
		klog.FromContext(ctx).V(1).Info("Tearing down", "trigger", klog.KObj(trigger), "wave", wave+1, "children", len(names))
		rc.out.tearingDown(trigger, msg)
	}
	if rc.rule.WritesStatus() {
		errs = append(errs, rc.applyStatus(ctx, trigger, nil, render.TearingDown(msg), nil))
	}
	return errors.Join(errs...)
}

// deleteWave deletes the children of doomed in wave (where says where
// they are, for the names), and returns the names of the wave's children,
// how many it deleted and what failed.
func (rc *reconciler) deleteWave(ctx context.Context, ch *changes, ref rules.ObjectRef, doomed []object, wave int, where string) ([]string, int, []error) {
	var names []string
	var errs []error
	deleted := 0
	for _, child := range doomed {
		if waveOf(rc.rule, child) != wave {
			continue
		}
		r := refOf(child)
		names = append(names, r.gvk.Kind+" "+cacheKey(r)+where)
		ck, ok := rc.w.children[r.gvk]
		if !ok || child.GetDeletionTimestamp() != nil || rc.writes.deletedAlready(r, child.GetUID()) {
			continue
		}
		// Foreground: the child stays, being deleted, until its own
		// dependents (a Deployment's Pods) are gone — which the next wave
		// waits for too.
		if err := rc.out.delete(ctx, ck.mapping, ref, child, ch, metav1.DeletePropagationForeground); err != nil {
			errs = append(errs, fmt.Errorf("tearing down %s %s%s: %w", r.gvk.Kind, cacheKey(r), where, err))
			continue
		}
		deleted++
	}
	return names, deleted, errs
}

// waveOf is the teardown wave of child: its resource's, or the first for
// a child whose resource is no longer in the rule (nothing syncloop knows
// reads it).
func waveOf(r *rules.Rule, child object) int {
	if res := r.Resource(rules.Annotation(child, rules.AnnotationResourceID)); res != nil {
		return res.Wave
	}
	return 0
}

// hold puts the rule's teardown finalizer on a trigger the rule wants
// when the rule orders its teardown and the trigger has children (or is
// getting some), or when the rule has a finalize function, and takes it
// off otherwise. It writes only a change.
func (rc *reconciler) hold(ctx context.Context, key cache.ObjectName, trigger *unstructured.Unstructured, wanted, hasChildren bool) error {
	finalizer := rc.rule.TeardownFinalizer()
	held := slices.Contains(trigger.GetFinalizers(), finalizer)
	want := wanted && (rc.rule.Finalizes() || (rc.rule.OrdersTeardown() && hasChildren))
	switch {
	case want == held:
		return nil
	case !want:
		return rc.unhold(ctx, key, trigger)
	}
	// Applied with a field manager of its own, which owns this one
	// element of the finalizers (a set): others' stay as they are.
	patch := markOf(trigger)
	patch.SetFinalizers([]string{finalizer})
	if err := rc.out.mark(ctx, rc.w.triggerMapping, patch, rc.rule.FieldManager()+"/teardown"); err != nil {
		return fmt.Errorf("holding the trigger for an ordered teardown (finalizer %s): %w", finalizer, err)
	}
	return nil
}

// unhold takes the rule's teardown finalizer off trigger, and remembers
// it did: the trigger's removal from the cache then needs no look at
// the API server (see released).
func (rc *reconciler) unhold(ctx context.Context, key cache.ObjectName, trigger *unstructured.Unstructured) error {
	finalizer := rc.rule.TeardownFinalizer()
	if err := rc.out.unfinalize(ctx, rc.w.triggerMapping, trigger, finalizer); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("taking the finalizer %s off the trigger: %w", finalizer, err)
	}
	rc.writes.unheld(key)
	return nil
}

// released makes sure a trigger the cache no longer holds does not keep
// the rule's finalizer: one that left the rule's selectors is not
// deleted, and would wait forever once it is. The API server is asked
// only when the rule orders its teardown and syncloop did not take the
// finalizer off itself.
func (rc *reconciler) released(ctx context.Context, key cache.ObjectName) error {
	if !rc.rule.HoldsTriggers() || rc.writes.wasUnheld(key) {
		return nil
	}
	live, err := rc.client.Get(ctx, rc.w.triggerMapping, key.Namespace, key.Name)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading a trigger that left the rule: %w", err)
	}
	if !slices.Contains(live.GetFinalizers(), rc.rule.TeardownFinalizer()) {
		return nil
	}
	return rc.unhold(ctx, key, live)
}

// mayHold reports whether the loop's triggers may hold the rule's teardown
// finalizer: its rule orders its teardown, or the revision a rollout
// under way moves from does (one finalizer serves every revision).
func (l *ruleLoop) mayHold() bool {
	if l.rule.HoldsTriggers() {
		return true
	}
	ro := l.ro.Load()
	return ro != nil && ro.from.rule.HoldsTriggers()
}

// unholdAll takes the rule's teardown finalizer off every trigger that
// holds it, once the loop has stopped (none of its reconciles puts it
// back): a removed rule never leaves a trigger undeletable. It reads the
// triggers from the API server, not the caches — which may not hold the
// finalizer a reconcile put on a moment ago, or may never have listed, if
// the loop was stopped while it started — as the rule's identity. A
// trigger it fails on keeps the finalizer until `syncloop finalizers
// remove`.
func (l *ruleLoop) unholdAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unholdTimeout)
	defer cancel()
	logger := klog.FromContext(ctx)
	a, err := l.e.actors.of(l.rule.Identity)
	if err != nil {
		logger.Error(err, "Leaving the teardown finalizer on the triggers of a removed rule")
		return
	}
	n, err := l.e.releaseRemoved(ctx, l.rule, a, l.rc.out)
	if err != nil {
		logger.Error(err, "Leaving the teardown finalizer on triggers of a removed rule")
	}
	if n > 0 {
		logger.Info("Took the teardown finalizer off the triggers of a removed rule", "triggers", n)
	}
}

// unholdTimeout bounds how long a removed rule's loop takes finalizers
// off its triggers.
const unholdTimeout = 30 * time.Second
