package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	dynamicpkg "github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// traceRule renders r for the trigger as a reconcile would, with the
// cluster as it is and without writing: each rendered child is read
// (found among the trigger's children, or by name), compared with what
// the rule renders, and its readiness is what render decides.
func traceRule(ctx context.Context, c *Clients, tr tracedRule, trigger *unstructured.Unstructured, fl *tracedFleet) RuleTrace {
	r := tr.rule
	rt := RuleTrace{Rule: r.Name, Revision: tr.revision, Hash: r.Hash, Rollout: tr.rollout}
	ob := &traceObserver{c: c, rule: r, trigger: trigger, fleet: fl, moving: tr.moving,
		found: map[string]*unstructured.Unstructured{}, in: map[string]string{}, traces: map[string]*ChildTrace{}}
	if err := ob.listChildren(ctx); err != nil {
		rt.Error = err.Error()
		return rt
	}
	lk := &traceLookuper{c: c, fleet: fl}
	rd, err := render.Rule(ctx, render.Input{Rule: r, Trigger: trigger, Scoper: fl.scoper(c.Mapper, r),
		Lookups: lk, Clusters: lk, Applier: ob, DryRun: true})
	rt.Lookups = lk.traces
	if err != nil {
		rt.Error = err.Error()
		return rt
	}
	if rd.Skipped {
		rt.Skipped, rt.Ready, rt.Reason = true, true, "when is false: the rule wants nothing of this trigger"
		return rt
	}
	desired := map[string]bool{}
	for _, st := range rd.Resources {
		res := ResourceTrace{ID: st.Resource.ID, State: TraceReady, Why: st.Why}
		switch {
		case st.Excluded:
			res.State, res.Why = TraceExcluded, "a resource it reads is excluded"
			if st.Resource.When != nil {
				res.Why = fmt.Sprintf("when %q is false", st.Resource.When.Source())
			}
		case st.WaitingForLookup != nil:
			res.State, res.Why = TraceWaiting, fmt.Sprintf("for the required lookup %q", st.WaitingForLookup.ID)
		case st.WaitingFor != nil:
			res.State, res.Why = TraceWaiting, fmt.Sprintf("for resource %q to be ready", st.WaitingFor.ID)
		case errors.As(st.Err, new(*render.ConflictError)):
			ce, _ := errors.AsType[*render.ConflictError](st.Err)
			res.State, res.Why = TraceConflict, fmt.Sprintf("%s %s %s", ce.Object.Kind, ce.Object.NamespacedName(), ce.Why)
		case st.Err != nil:
			res.State = TraceFailed
		case !st.Ready:
			res.State = TraceNotReady
		}
		for _, ch := range rd.Children {
			if ch.ResourceID == st.Resource.ID {
				k := clusterKey(ch.Cluster, ch.Object)
				desired[k] = true
				if t := ob.traces[k]; t != nil {
					res.Children = append(res.Children, *t)
				}
			}
		}
		// Children a waiting resource keeps as they are.
		if res.State == TraceWaiting || res.State == TraceFailed {
			for k, obj := range ob.found {
				if !desired[k] && rules.Annotation(obj, rules.AnnotationResourceID) == st.Resource.ID {
					desired[k] = true
					res.Children = append(res.Children, ob.asIs(obj, ob.in[k]))
				}
			}
			sortChildren(res.Children)
		}
		rt.Resources = append(rt.Resources, res)
	}
	for k, obj := range ob.found {
		if !desired[k] {
			rt.Undesired = append(rt.Undesired, ob.asIs(obj, ob.in[k]))
		}
	}
	sortChildren(rt.Undesired)
	cond := rd.Readiness()
	rt.Ready, rt.Reason, rt.Message = cond.Status, cond.Reason, cond.Message
	return rt
}

// traceObserver is render's Applier for a trace: it writes nothing and
// answers with each child as it is.
type traceObserver struct {
	c       *Clients
	rule    *rules.Rule
	trigger *unstructured.Unstructured
	// fleet are the clusters of the fleet, when the rule targets some;
	// moving the rollout under way to the rule traced (nil: none).
	fleet  *tracedFleet
	moving *rollout.Record
	// found are the trigger's children of the rule, by clusterKey, and in
	// the cluster each is in ("": syncloop's own); traces what Apply
	// found of each rendered child.
	found  map[string]*unstructured.Unstructured
	in     map[string]string
	traces map[string]*ChildTrace
}

// listChildren lists the trigger's children of the rule by their labels:
// one list per kind and namespace — the namespaces the templates name, or
// all when one is computed — so that a user who may read one namespace
// can trace a trigger there; those of resources that target clusters in
// every cluster of the fleet (one that cannot be listed is down: its
// children are not reachable).
func (o *traceObserver) listChildren(ctx context.Context) error {
	home, remote := o.childKinds()
	if err := o.listIn(ctx, "", home); err != nil {
		return err
	}
	if len(remote) == 0 {
		return nil
	}
	for _, cl := range o.fleet.Clusters() {
		if err := o.listIn(ctx, cl.Name, remote); err != nil {
			o.fleet.failed(cl.Name, err)
		}
	}
	return nil
}

// childKinds are the kinds of the rule's children and the namespaces to
// list them in: of its resources in syncloop's own cluster, and of those
// that target clusters.
func (o *traceObserver) childKinds() (home, remote map[schema.GroupVersionKind]map[string]bool) {
	home, remote = map[schema.GroupVersionKind]map[string]bool{}, map[schema.GroupVersionKind]map[string]bool{}
	for _, res := range o.rule.Resources {
		if res.Mode == rules.ModePatch {
			continue
		}
		ns := metav1.NamespaceAll
		switch {
		case res.NoNamespace:
			ns = o.trigger.GetNamespace()
		case res.LiteralNamespace != "":
			ns = res.LiteralNamespace
		}
		where := home
		if res.Targets() {
			where = remote
		}
		for _, k := range res.Kinds {
			if where[k.GVK] == nil {
				where[k.GVK] = map[string]bool{}
			}
			where[k.GVK][ns] = true
		}
	}
	return home, remote
}

// listIn lists the trigger's children of kinds in cluster ("": syncloop's
// own).
func (o *traceObserver) listIn(ctx context.Context, cluster string, kinds map[schema.GroupVersionKind]map[string]bool) error {
	sel := engine.TriggerChildren(o.rule, string(o.trigger.GetUID()))
	for gvk, namespaces := range kinds {
		ri, namespaced, err := o.resource(ctx, cluster, gvk)
		if err != nil {
			return err
		}
		if !namespaced || namespaces[metav1.NamespaceAll] {
			namespaces = map[string]bool{metav1.NamespaceAll: true}
		}
		for ns := range namespaces {
			list, err := ri.Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
			if err != nil {
				return fmt.Errorf("children of kind %s: %w", gvk.Kind, err)
			}
			for i := range list.Items {
				k := clusterKey(cluster, &list.Items[i])
				o.found[k], o.in[k] = &list.Items[i], cluster
			}
		}
	}
	return nil
}

// resource is kind gvk's resource in cluster ("": syncloop's own), and
// whether it is namespaced.
func (o *traceObserver) resource(ctx context.Context, cluster string, gvk schema.GroupVersionKind) (dynamic.NamespaceableResourceInterface, bool, error) {
	client, mapper := o.c.Dynamic, o.c.Mapper
	if cluster != "" {
		r, err := o.fleet.reach(cluster)
		if err != nil {
			return nil, false, err
		}
		client, mapper = r.Client, r.Mapper
	}
	m, err := mapper.Mapping(ctx, gvk)
	if err != nil {
		return nil, false, err
	}
	return client.Dynamic.Resource(m.Resource), m.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// Apply reads the child c renders: among the trigger's children, or by
// name, where an object not syncloop's to write is a conflict.
func (o *traceObserver) Apply(ctx context.Context, c render.Child) (map[string]any, error) {
	k := clusterKey(c.Cluster, c.Object)
	t := &ChildTrace{TraceObject: objectOf(c.Object), Resource: c.ResourceID, Patch: c.Patch, Cluster: c.Cluster}
	t.UID, t.Created = "", time.Time{} // a template's, if it has any: not the child's
	o.traces[k] = t
	if err := o.fleet.unreachable(c.Cluster); err != nil {
		t.Unreachable = err.Error()
		return nil, err
	}
	if why := o.heldFrom(ctx, c.Cluster); why != "" {
		if live := o.found[k]; live != nil {
			*t = o.asIs(live, c.Cluster)
		}
		t.Held = why
		return nil, &render.HeldError{Cluster: c.Cluster, Why: why}
	}
	live := o.found[k]
	if live == nil {
		ri, _, err := o.resource(ctx, c.Cluster, c.Object.GroupVersionKind())
		if err != nil {
			return nil, err
		}
		got, err := ri.Namespace(c.Object.GetNamespace()).Get(ctx, c.Object.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil && c.Cluster != "" && dynamicpkg.NoAnswer(err):
			o.fleet.failed(c.Cluster, err)
			err = o.fleet.unreachable(c.Cluster)
			t.Unreachable = err.Error()
			return nil, err
		case err != nil:
			return nil, err
		}
		if !c.Patch {
			if _, err := render.Takeover(o.rule, c, rules.TriggerOf(o.trigger), got); err != nil {
				t.Exists, t.UID, t.Created = true, string(got.GetUID()), got.GetCreationTimestamp().Time
				if ce, ok := errors.AsType[*render.ConflictError](err); ok {
					t.Conflict = ce.Why + ": not taking it over"
					if ce.Hint != "" {
						t.Conflict += " (" + ce.Hint + ")"
					}
				}
				return nil, err
			}
		}
		live = got
	}
	*t = o.describe(live, c)
	return live.Object, nil
}

// heldFrom says why the rollout by cluster under way keeps the revision
// traced out of cluster, as the engine's applier does; "" when it does
// not.
func (o *traceObserver) heldFrom(ctx context.Context, cluster string) string {
	if o.moving == nil || cluster == "" {
		return ""
	}
	for _, c := range o.fleet.Clusters() {
		if c.Name == cluster {
			return o.moving.HeldFrom(ctx, o.rule.Rollout, c)
		}
	}
	return ""
}

// Observed implements render.Applier: a child as it is.
func (o *traceObserver) Observed(c render.Child) map[string]any {
	if live := o.found[clusterKey(c.Cluster, c.Object)]; live != nil {
		return live.Object
	}
	return nil
}

// describe is live, a rendered child c, compared with c.
func (o *traceObserver) describe(live *unstructured.Unstructured, c render.Child) ChildTrace {
	t := ChildTrace{TraceObject: objectOf(live), Resource: c.ResourceID, Patch: c.Patch, Cluster: c.Cluster, Exists: true, Updated: o.updated(live, c.Patch)}
	if c.Patch { // a patch carries no hash: its fields alone decide
		if t.Drift = engine.Difference(live.Object, c.Object.Object); t.Drift != "" {
			t.Drift = strings.TrimPrefix(t.Drift, ".") + " differs from the rule"
		}
	} else {
		t.Drift = engine.Drift(live, c.Object.Object, o.rule.FieldManager())
	}
	t.Synced = t.Drift == ""
	return t
}

// asIs describes a child in cluster the render did not compare: kept as
// it is by a resource that waits, or not wanted.
func (o *traceObserver) asIs(obj *unstructured.Unstructured, cluster string) ChildTrace {
	return ChildTrace{TraceObject: objectOf(obj), Resource: rules.Annotation(obj, rules.AnnotationResourceID), Cluster: cluster, Exists: true, AsIs: true, Updated: o.updated(obj, false)}
}

// updated is when the rule last wrote obj: the time of its field
// manager's entry (for a patch, of the trigger's patch manager).
func (o *traceObserver) updated(obj *unstructured.Unstructured, patch bool) time.Time {
	var last time.Time
	for _, mf := range obj.GetManagedFields() {
		own := mf.Manager == o.rule.FieldManager()
		if patch {
			own = strings.HasPrefix(mf.Manager, o.rule.FieldManager()+"/")
		}
		if own && mf.Time != nil && mf.Time.After(last) {
			last = mf.Time.Time
		}
	}
	return last
}

// traceLookuper reads lookups from the API server and records what each
// resolved to; the clusters of the fleet are those of the kubeconfig
// Secrets (render.ClusterLister).
type traceLookuper struct {
	c      *Clients
	fleet  *tracedFleet
	traces []LookupTrace
}

func (l *traceLookuper) Clusters() []rules.Cluster { return l.fleet.Clusters() }

func (l *traceLookuper) Lookup(ctx context.Context, q render.LookupQuery) ([]*unstructured.Unstructured, error) {
	t := LookupTrace{ID: q.Lookup.ID, Kind: q.Lookup.Kind, Required: q.Lookup.Required, Found: []string{}}
	m, err := l.c.Mapper.Mapping(ctx, q.Lookup.GVK)
	if err != nil {
		return nil, err
	}
	ri := l.c.Dynamic.Dynamic.Resource(m.Resource).Namespace(q.Namespace)
	var out []*unstructured.Unstructured
	if q.Name != "" {
		t.Query = join(q.Namespace, q.Name)
		obj, err := ri.Get(ctx, q.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		default:
			out = append(out, obj)
		}
	} else {
		t.Query = "list"
		if q.Namespace != "" {
			t.Query += " in " + q.Namespace
		}
		if !q.Selector.Empty() {
			t.Query += " labelled " + q.Selector.String()
		}
		list, err := ri.List(ctx, metav1.ListOptions{LabelSelector: q.Selector.String()})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
	}
	for _, obj := range out {
		t.Found = append(t.Found, join(obj.GetNamespace(), obj.GetName()))
	}
	l.traces = append(l.traces, t)
	return out, nil
}

func join(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// childKey identifies a child: group, kind, namespace and name.
func childKey(obj *unstructured.Unstructured) string {
	gvk := obj.GroupVersionKind()
	return gvk.Group + "/" + gvk.Kind + "/" + obj.GetNamespace() + "/" + obj.GetName()
}

// clusterKey identifies a child in a cluster of the fleet ("": syncloop's
// own).
func clusterKey(cluster string, obj *unstructured.Unstructured) string {
	if cluster == "" {
		return childKey(obj)
	}
	return cluster + "|" + childKey(obj)
}

func sortChildren(cs []ChildTrace) {
	slices.SortFunc(cs, func(a, b ChildTrace) int {
		return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
}
