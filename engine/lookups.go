package engine

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// cacheLookuper answers a reconcile's lookups from the informer caches and
// records what it was asked, so that the trigger is queued again when the
// answer changes. A query is recorded before the cache is read: an event
// that lands after the read finds it.
type cacheLookuper struct {
	rc      *reconciler
	trigger cache.ObjectName
	queries []render.LookupQuery
}

// renderInput is the render of rc's rule for trigger (key) over the
// caches, each read through one cacheLookuper, and its children brought
// about by ap (nil: offline).
func (rc *reconciler) renderInput(trigger *unstructured.Unstructured, lk *cacheLookuper, ap render.Applier) render.Input {
	return render.Input{Rule: rc.rule, Trigger: trigger, Scoper: rc.mapper,
		Lookups: lk, Clusters: lk, Children: lk, Resources: lk, Applier: ap}
}

// Children implements render.ChildLister: the trigger's children in the
// caches, whole.
func (lk *cacheLookuper) Children(context.Context) []*unstructured.Unstructured {
	owner := lk.rc.triggerRef(lk.trigger).Owner()
	existing := lk.rc.childrenOf(owner)
	out := make([]*unstructured.Unstructured, len(existing))
	for i, o := range existing {
		out[i] = wholeOf(o)
	}
	return out
}

// Clusters implements render.ClusterLister: the fleet's clusters, none
// without one.
func (lk *cacheLookuper) Clusters() []rules.Cluster {
	if lk.rc.fleet == nil {
		return nil
	}
	return lk.rc.fleet.fleet.Clusters()
}

// Resource implements render.Resourcer: the resource l's kind is served
// as.
func (lk *cacheLookuper) Resource(l *rules.Lookup) string {
	if m := lk.rc.w.lookups[l.Index].mapping; m != nil {
		return m.Resource.Resource
	}
	return ""
}

// Lookup implements render.Lookuper.
func (lk *cacheLookuper) Lookup(_ context.Context, q render.LookupQuery) ([]*unstructured.Unstructured, error) {
	rc := lk.rc
	if ns := rc.w.ns; ns != "" && q.Namespace != ns && (q.Namespace != "" || namespaced(rc.w.lookups[q.Lookup.Index].mapping)) {
		where := "in all namespaces"
		if q.Namespace != "" {
			where = "in namespace " + q.Namespace
		}
		return nil, terminal(fmt.Errorf("reads %s %s, outside namespace %q: %s", q.Lookup.Kind, where, ns, rc.w.limit()))
	}
	lw := rc.w.lookups[q.Lookup.Index]
	lk.queries = append(lk.queries, q)
	rc.deps.add(lk.trigger, q)
	idx := lw.sub.Indexer()
	if q.Name != "" {
		key := q.Name
		if q.Namespace != "" {
			key = q.Namespace + "/" + q.Name
		}
		obj, ok, err := idx.GetByKey(key)
		if err != nil || !ok {
			return nil, err
		}
		return []*unstructured.Unstructured{wholeOf(obj)}, nil
	}
	var objs []any
	if q.Namespace != "" {
		objs, _ = idx.ByIndex(cache.NamespaceIndex, q.Namespace)
	} else {
		objs = idx.List()
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if m, ok := o.(object); ok && q.Selector.Matches(rules.Labels(m)) {
			out = append(out, wholeOf(m))
		}
	}
	return out, nil
}

// lookupIndex maps looked-up objects back to the triggers that read them:
// by lookup, namespace and name for lookups of one object; by lookup,
// namespace and selector for lists. An event costs one map read per
// distinct list query of its lookup, not a pass over the triggers.
type lookupIndex struct {
	mu        sync.Mutex
	byTrigger map[cache.ObjectName]map[depKey]bool
	named     map[depKey]map[cache.ObjectName]bool
	lists     map[int]map[depKey]*listDep // by lookup
}

// depKey is one resolved query: a name, or (name empty) a selector.
type depKey struct {
	lookup          int
	namespace, name string
	selector        string
}

type listDep struct {
	selector labels.Selector
	triggers map[cache.ObjectName]bool
}

func newLookupIndex() *lookupIndex {
	return &lookupIndex{byTrigger: map[cache.ObjectName]map[depKey]bool{},
		named: map[depKey]map[cache.ObjectName]bool{}, lists: map[int]map[depKey]*listDep{}}
}

func keyOf(q render.LookupQuery) depKey {
	k := depKey{lookup: q.Lookup.Index, namespace: q.Namespace, name: q.Name}
	if q.Name == "" {
		k.selector = q.Selector.String()
	}
	return k
}

// add records that trigger reads q's answer.
func (x *lookupIndex) add(trigger cache.ObjectName, q render.LookupQuery) {
	x.addKey(trigger, keyOf(q), q.Selector)
}

// addKey records that trigger depends on k; sel is a list's selector.
func (x *lookupIndex) addKey(trigger cache.ObjectName, k depKey, sel labels.Selector) {
	x.mu.Lock()
	defer x.mu.Unlock()
	deps := x.byTrigger[trigger]
	if deps == nil {
		deps = map[depKey]bool{}
		x.byTrigger[trigger] = deps
	}
	if deps[k] {
		return
	}
	deps[k] = true
	if k.name != "" {
		ts := x.named[k]
		if ts == nil {
			ts = map[cache.ObjectName]bool{}
			x.named[k] = ts
		}
		ts[trigger] = true
		return
	}
	lists := x.lists[k.lookup]
	if lists == nil {
		lists = map[depKey]*listDep{}
		x.lists[k.lookup] = lists
	}
	ld := lists[k]
	if ld == nil {
		ld = &listDep{selector: sel, triggers: map[cache.ObjectName]bool{}}
		lists[k] = ld
	}
	ld.triggers[trigger] = true
}

// set makes qs the whole of what trigger reads (none: it reads nothing).
func (x *lookupIndex) set(trigger cache.ObjectName, qs []render.LookupQuery) {
	keep := make(map[depKey]bool, len(qs))
	for _, q := range qs {
		keep[keyOf(q)] = true
	}
	x.setKeys(trigger, keep)
}

// setKeys makes keep the whole of what trigger depends on.
func (x *lookupIndex) setKeys(trigger cache.ObjectName, keep map[depKey]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.byTrigger[trigger] {
		if keep[k] {
			continue
		}
		delete(x.byTrigger[trigger], k)
		if k.name != "" {
			delete(x.named[k], trigger)
			if len(x.named[k]) == 0 {
				delete(x.named, k)
			}
			continue
		}
		if ld := x.lists[k.lookup][k]; ld != nil {
			delete(ld.triggers, trigger)
			if len(ld.triggers) == 0 {
				delete(x.lists[k.lookup], k)
			}
		}
	}
	if len(x.byTrigger[trigger]) == 0 {
		delete(x.byTrigger, trigger)
	}
}

// each calls f for every trigger that reads the object namespace/name with
// labels set through lookup number i.
func (x *lookupIndex) each(i int, namespace, name string, set labels.Labels, f func(cache.ObjectName)) {
	x.mu.Lock()
	var out []cache.ObjectName
	for t := range x.named[depKey{lookup: i, namespace: namespace, name: name}] {
		out = append(out, t)
	}
	for k, ld := range x.lists[i] {
		if (k.namespace == "" || k.namespace == namespace) && ld.selector.Matches(set) {
			for t := range ld.triggers {
				out = append(out, t)
			}
		}
	}
	x.mu.Unlock()
	for _, t := range out {
		f(t)
	}
}

// queue queues, once, every trigger that read one of objs through lookup
// number i (by name) or whose list selects it — objs are an object before
// and after a change. (Once: a trigger queued again while a worker
// reconciles it is reconciled twice.)
func (x *lookupIndex) queue(i int, objs []any, add func(cache.ObjectName)) {
	triggers := map[cache.ObjectName]bool{}
	for _, obj := range objs {
		m, err := meta.Accessor(unwrap(obj))
		if err != nil {
			continue
		}
		x.each(i, m.GetNamespace(), m.GetName(), rules.Labels(m), func(t cache.ObjectName) { triggers[t] = true })
	}
	for t := range triggers {
		add(t)
	}
}

// readsNamed reports whether some trigger read namespace/name through
// lookup number i (by name).
func (x *lookupIndex) readsNamed(i int, namespace, name string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.named[depKey{lookup: i, namespace: namespace, name: name}]) > 0
}

// len is how many triggers read lookups, for tests.
func (x *lookupIndex) len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.byTrigger)
}

// keysOf adds to into what trigger depends on through lookup (or patch
// resource) number i.
func (x *lookupIndex) keysOf(trigger cache.ObjectName, i int, into map[depKey]bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.byTrigger[trigger] {
		if k.lookup == i {
			into[k] = true
		}
	}
}
