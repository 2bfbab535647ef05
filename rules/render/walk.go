package render

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// graphWalk is one render's pass over the resources in dependency order.
type graphWalk struct {
	in      Input // its Applier never nil: offline, the renderedApplier
	rd      *Rendered
	offline bool
	seen    map[string]string // kind/namespace/name → resource id
	states  map[*rules.Resource]*ResourceState
}

// resource renders and applies res's children, unless it waits or is
// excluded, and notes its state.
func (w *graphWalk) resource(ctx context.Context, res *rules.Resource) error {
	st := &ResourceState{Resource: res}
	w.states[res] = st
	w.rd.Resources = append(w.rd.Resources, st)
	if ok, err := w.proceeds(ctx, res, st); !ok || err != nil {
		return err
	}
	// The kinds of a computed one share their scope (a load error
	// otherwise, where the scopes are known).
	namespaced, err := w.in.Scoper.Namespaced(res.Kinds[0].GVK)
	if err != nil {
		pos, field := res.Body()
		return &RenderError{Pos: pos, Rule: w.in.Rule.Name, Resource: res.ID, Field: field, Err: err}
	}
	var lives []any
	st.Ready = true
	if res.Function != nil {
		objs, err := w.callFunction(ctx, res, namespaced)
		if err != nil {
			return err
		}
		for i, obj := range objs {
			live, err := w.take(ctx, res, st, i, obj, "")
			if err != nil {
				return err
			}
			if live != nil {
				lives = append(lives, live)
			}
		}
		w.rd.children[res.ID] = nonNilList(lives)
		w.rd.ready[res.ID] = st.Ready
		return nil
	}
	targets, err := w.clusters(ctx, res, st)
	if err != nil {
		return err
	}
	for _, at := range targets {
		act := w.rd.act
		if at.Cluster != nil {
			cp := *act
			cp.Cluster = at.Cluster.Value()
			act = &cp
		}
		items, err := w.items(ctx, res, act)
		if err != nil {
			return err
		}
		for i, item := range items {
			index, act := -1, act
			if res.ForEach != nil {
				index = i
				cp := *act
				cp.Item, cp.Index = item, int64(i)
				act = &cp
			}
			live, err := w.child(ctx, res, st, index, act, namespaced, at.Name)
			if err != nil {
				return err
			}
			if live != nil {
				lives = append(lives, live)
			}
		}
	}
	switch {
	case res.Many():
		w.rd.children[res.ID] = nonNilList(lives)
	case len(lives) == 1:
		w.rd.children[res.ID] = lives[0]
	}
	w.rd.ready[res.ID] = st.Ready
	return nil
}

// proceeds reports whether res is rendered: not while a required lookup
// it reads is absent or a resource it reads is not ready (it waits), nor
// when a resource it reads is excluded or its when is false (it is
// excluded); st says which.
func (w *graphWalk) proceeds(ctx context.Context, res *rules.Resource, st *ResourceState) (bool, error) {
	if q := waitingFor(res.Lookups, w.rd.absent); q != nil {
		st.WaitingForLookup = q.Lookup
		st.Why = fmt.Sprintf("waiting for lookup %q: %s", q.Lookup.ID, q.absence())
		return false, nil
	}
	for _, dep := range res.Deps {
		ds := w.states[dep]
		switch {
		case ds.Excluded:
			st.Excluded = true
			st.Why = fmt.Sprintf("resource %q, which it reads, is not wanted", dep.ID)
			return false, nil
		case !ds.Ready && (!w.offline || ds.Err != nil || ds.waits()): // offline, a dependency not applied (a conflict, a lookup) holds its dependents too
			st.WaitingFor = dep
			st.Why = fmt.Sprintf("waiting for resource %q", dep.ID)
			return false, nil
		}
	}
	if res.When == nil {
		return true, nil
	}
	ok, err := res.When.EvalBool(ctx, w.rd.act)
	switch {
	case err != nil && w.offline && res.When.Unknown(err):
		w.rd.note(res, "%s: %v: known only on the server; rendered as if true", res.When.Field, err)
		ok = true
	case err != nil:
		return false, exprError(w.in.Rule, res.When, res.ID, err)
	}
	if !ok {
		st.Excluded = true
		st.Why = "its when is false"
	}
	return ok, nil
}

// items are what res renders a child for: its forEach's list, or one nil
// item without forEach.
func (w *graphWalk) items(ctx context.Context, res *rules.Resource, act *expr.Activation) ([]any, error) {
	if res.ForEach == nil {
		return []any{nil}, nil
	}
	items, err := res.ForEach.EvalList(ctx, act)
	switch {
	case err != nil && w.offline && res.ForEach.Unknown(err):
		w.rd.note(res, "%s: %v: known only on the server; rendered no children", res.ForEach.Field, err)
		items = nil
	case err != nil:
		return nil, exprError(w.in.Rule, res.ForEach, res.ID, err)
	}
	if n := len(w.rd.Children) + len(items); n > MaxChildren {
		return nil, &RenderError{Pos: res.ForEach.Pos, Rule: w.in.Rule.Name, Resource: res.ID, Field: res.ForEach.Field,
			Err: fmt.Errorf("%d children, more than the %d one trigger may have", n, MaxChildren)}
	}
	return items, nil
}

// child renders one child of res for act and has it applied; it returns
// the child as it now is (nil: not applied, or absent), and notes in st
// why it is not ready. An error is the render's: the trigger fails.
func (w *graphWalk) child(ctx context.Context, res *rules.Resource, st *ResourceState, index int, act *expr.Activation, namespaced bool, cluster string) (map[string]any, error) {
	obj, err := renderChild(ctx, w.in.Rule, res, act, w.in.Trigger, w.in.Trigger.GetNamespace() != "", namespaced)
	if err != nil {
		return nil, err
	}
	return w.take(ctx, res, st, index, obj, cluster)
}

// take makes obj, rendered or returned by a function, child index of res
// (-1: its only one) in cluster ("": syncloop's own) and has it applied;
// as child.
func (w *graphWalk) take(ctx context.Context, res *rules.Resource, st *ResourceState, index int, obj *unstructured.Unstructured, cluster string) (map[string]any, error) {
	key := cluster + "/" + obj.GetKind() + "/" + obj.GetNamespace() + "/" + obj.GetName()
	if prev, dup := w.seen[key]; dup {
		pos, field := res.Body()
		return nil, &RenderError{Pos: pos, Rule: w.in.Rule.Name, Resource: res.ID, Field: field,
			Err: fmt.Errorf("%s %s rendered twice%s (also by resource %q)", obj.GetKind(), namespacedName(obj), inCluster(cluster), prev)}
	}
	w.seen[key] = res.ID
	c := Child{ResourceID: res.ID, Index: index, Object: obj, Resource: res, Patch: res.Mode == rules.ModePatch, Cluster: cluster}
	w.rd.Children = append(w.rd.Children, c)

	if res.CreateOnce && w.offline && index <= 0 {
		w.rd.note(res, "createOnce: created when absent, then left as it is (never updated, not created again once deleted)")
	}
	live, err := w.apply(ctx, c)
	notReady := func(why string) {
		w.notReady(st, why)
		w.rd.clusterNotReady(cluster, why)
	}
	switch {
	case errors.As(err, new(*HeldError)):
		// Held back by the rollout: as it is, for its dependents and
		// the status, and not what makes the resource ready or not.
		st.Held = appendNew(st.Held, cluster)
		w.rd.clusterHeld(cluster, err.Error())
		return w.in.Applier.Observed(c), nil
	case errors.As(err, new(*UnreachableError)):
		st.Unreachable = appendNew(st.Unreachable, cluster)
		notReady(err.Error())
		return nil, nil
	case errors.Is(err, ErrNotRecreated):
		notReady(fmt.Sprintf("%s %s was %v", obj.GetKind(), namespacedName(obj), err))
		return nil, nil
	case err != nil:
		if st.Err == nil {
			st.Err = err
		}
		notReady(fmt.Sprintf("%s %s: %v", obj.GetKind(), namespacedName(obj), err))
		if !c.Patch && !errors.As(err, new(*ConflictError)) {
			return w.in.Applier.Observed(c), nil // as it is: for the status, not for dependents (they wait)
		}
		return nil, nil
	case live == nil:
		notReady(fmt.Sprintf("%s %s does not exist", obj.GetKind(), namespacedName(obj)))
		return nil, nil
	}
	if why := w.readiness(ctx, res, live); why != "" {
		notReady(fmt.Sprintf("%s %s: %s", obj.GetKind(), namespacedName(obj), why))
	}
	return live, nil
}

// apply has the applier apply child, unless it is what one of the
// trigger's lookups reads; a conflict is noted in the render's Conflicts.
func (w *graphWalk) apply(ctx context.Context, child Child) (map[string]any, error) {
	var err error
	if !child.Patch {
		err = w.rd.reads.conflict(w.in.Rule, child, rules.TriggerOf(w.in.Trigger))
	}
	var live map[string]any
	if err == nil {
		live, err = w.in.Applier.Apply(ctx, child)
	}
	if ce, ok := errors.AsType[*ConflictError](err); ok {
		w.rd.Conflicts = append(w.rd.Conflicts, ce)
	}
	return live, err
}

// notReady marks st not ready, keeping the first reason.
func (w *graphWalk) notReady(st *ResourceState, why string) {
	if st.Ready {
		st.Why = why
	}
	st.Ready = false
}

// readiness evaluates res's readyWhen on a live child and says why it is
// not ready, or "". An expression that fails (a status field not there
// yet) is not ready. Offline, a readyWhen that does not hold is noted and
// the child counts as ready for its dependents.
func (w *graphWalk) readiness(ctx context.Context, res *rules.Resource, live map[string]any) string {
	for _, e := range res.ReadyWhen {
		ok, err := e.EvalBool(ctx, &expr.Activation{Self: live})
		why := ""
		switch {
		case err != nil:
			why = fmt.Sprintf("readyWhen %q: %v", e.Source(), err)
		case !ok:
			why = fmt.Sprintf("readyWhen %q is false", e.Source())
		}
		if why == "" {
			continue
		}
		if w.offline {
			then := "it is not ready offline"
			if len(res.Dependents) > 0 {
				then = "the resources that read it are rendered with what is known"
			}
			w.rd.note(res, "%s cannot hold on the rendered child (%s): %s", e.Field, why, then)
		}
		return why
	}
	return ""
}

func (rd *Rendered) note(res *rules.Resource, format string, args ...any) {
	rd.Notes = append(rd.Notes, fmt.Sprintf("resource %q: ", res.ID)+fmt.Sprintf(format, args...))
}

func nonNilList(l []any) []any {
	if l == nil {
		return []any{}
	}
	return l
}

// renderedApplier is the offline Applier: a child is as rendered, or, when
// the objects given offline hold it (the cluster's state: a Secret whose
// token the server filled in), that object with the rendered fields
// applied over it — if the rule may write it (Takeover), as in the
// cluster.
type renderedApplier struct {
	objs    Objects
	rule    *rules.Rule
	trigger rules.Trigger
}

// Observed implements Applier: offline, nothing is in the cluster but
// what a render lays over it.
func (renderedApplier) Observed(Child) map[string]any { return nil }

func (a renderedApplier) Apply(_ context.Context, c Child) (map[string]any, error) {
	if c.Cluster != "" { // the objects given are syncloop's own cluster's
		return c.Object.Object, nil
	}
	gk := c.Object.GroupVersionKind().GroupKind()
	for _, o := range a.objs {
		if o.GroupVersionKind().GroupKind() == gk && o.GetNamespace() == c.Object.GetNamespace() && o.GetName() == c.Object.GetName() {
			if !c.Patch {
				if _, err := Takeover(a.rule, c, a.trigger, o); err != nil {
					return nil, err
				}
			}
			return overlay(o.Object, c.Object.Object), nil
		}
	}
	return c.Object.Object, nil
}

// overlay is base with over's fields set over it: maps merge, the rest is
// replaced — what applying over means for the fields a child sets.
func overlay(base, over map[string]any) map[string]any {
	out := make(map[string]any, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if om, ok := v.(map[string]any); ok {
			if bm, ok := out[k].(map[string]any); ok {
				out[k] = overlay(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}
