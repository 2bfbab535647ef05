package engine

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// store is what a reconcile reads of one informer: its objects, indexed,
// and whether its first list has been delivered. The reconciler reads
// nothing else of its informers, so a table of objects stands in for them
// in the decision tests.
type store interface {
	Indexer() cache.Indexer
	HasSynced() bool
}

// informer is a rule's subscription to a shared informer as its loop uses
// it: a store, and what starting, sharding and stopping need
// (dynamic.Subscription).
type informer interface {
	store
	// Synced is closed once HasSynced.
	Synced() <-chan struct{}
	// LastError says why it has not synced: a list or watch refused.
	LastError() error
	Key() dynamic.WatchKey
	// Refresh lists again; Drop lets go of what a filter keeps no more.
	Refresh(ctx context.Context) error
	Drop(gone func(obj any)) int
	Stop()
}

// synced waits until s has synced or ctx ends, and reports which.
func synced(ctx context.Context, s informer) bool {
	select {
	case <-s.Synced():
		return true
	case <-ctx.Done():
		return s.HasSynced()
	}
}

// kindMapper maps a kind to its resource (dynamic.Mapper).
type kindMapper interface {
	Mapping(ctx context.Context, gvk schema.GroupVersionKind) (*meta.RESTMapping, error)
}

// watches are one rule's kinds as the API server serves them and the
// shared informers its reconciles read: the trigger's, one per child kind,
// one per lookup, one per patch resource. The rule's loop resolves and
// subscribes them before any worker starts; afterwards they are read-only,
// and the reconciler reads them without a lock.
type watches struct {
	rule *rules.Rule
	ns   string // the engine's namespace (Options.Namespace), else a tenant rule's; "" all
	// actor is the identity the rule acts as: its informers are that
	// identity's, its requests that identity's.
	actor *actor
	// filter: the trigger and child informers are the rule's own and
	// cache only its replica's share (share.go).
	filter bool
	// cluster is the cluster of the fleet the children informers are of
	// (a place's); "": syncloop's own.
	cluster string

	triggerMapping *meta.RESTMapping
	trigger        informer
	children       map[schema.GroupVersionKind]*childKind
	lookups        []*lookupWatch // one per rule lookup
	patches        []*patchWatch  // one per mode: patch resource, then the retired

	// What earlier versions of the rule made and this one does not: their
	// children are pruned, what they patched is released (see newRuleLoop).
	retired        []schema.GroupVersionKind
	retiredPatches []*patchWatch
}

// childKind is one kind of child: how to reach it and its shared informer.
type childKind struct {
	mapping *meta.RESTMapping
	sub     informer
	// ns is the namespace its informer lists in ("" every one): the
	// engine's, or, for a rule acting as an identity of its own, the one
	// namespace the rule puts every child of the kind in (childNamespace).
	ns string
	// retired: the rule made this kind before it changed and makes it no
	// more. Its children are watched only to be pruned, best effort: the
	// rule neither waits for the kind nor for its informer.
	retired bool
}

// lookupWatch is one of a rule's lookups: how to reach its kind and the
// shared informer its objects are read from.
type lookupWatch struct {
	index   int // in rule.Lookups
	mapping *meta.RESTMapping
	sub     informer
}

// patchWatch is the informer of a mode: patch resource: the objects it may
// patch, with the patch managers' managedFields. res is nil for a watch an
// earlier version of the rule had: kept only to release what it patched.
type patchWatch struct {
	res     *rules.Resource
	key     dynamic.WatchKey
	mapping *meta.RESTMapping
	sub     informer
}

// resolve maps the trigger kind and every child, lookup and patch kind —
// but the kinds of resources that target clusters, which only those
// clusters need serve — retrying with backoff while one is not served (a
// CRD not installed yet); waiting is told why each time. It returns false
// when ctx ends first.
func (w *watches) resolve(ctx context.Context, mapper kindMapper, waiting func(error)) bool {
	kinds := []schema.GroupVersionKind{w.rule.Watch.GVK}
	for _, r := range w.rule.Resources {
		if r.Targets() {
			continue // the clusters' kinds, which syncloop's own need not serve: each place maps them
		}
		for _, k := range r.Kinds {
			kinds = append(kinds, k.GVK)
		}
	}
	for _, l := range w.rule.Lookups {
		kinds = append(kinds, l.GVK)
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		mappings, missing := map[schema.GroupVersionKind]*meta.RESTMapping{}, error(nil)
		for _, gvk := range kinds {
			m, err := mapper.Mapping(ctx, gvk)
			if err != nil {
				missing = fmt.Errorf("kind %s: %w", gvk, err)
				break
			}
			// The kind a rule defines is its own CRD's resource, never
			// another CRD's of the same kind (one whose names the API
			// server accepted before the rule's).
			if a := w.rule.API; a != nil && gvk == a.GVK && m.Resource.Resource != a.Plural {
				missing = fmt.Errorf("kind %s is served as %s, not by the rule's CustomResourceDefinition %s", gvk, m.Resource.GroupResource(), a.CRDName())
				break
			}
			mappings[gvk] = m
		}
		if missing == nil {
			w.mapped(ctx, mapper, mappings)
			return true
		}
		waiting(missing)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff.Step()):
		}
	}
}

// mapped sets the watches from the mappings of every kind of the rule.
func (w *watches) mapped(ctx context.Context, mapper kindMapper, mappings map[schema.GroupVersionKind]*meta.RESTMapping) {
	w.triggerMapping = mappings[w.rule.Watch.GVK]
	w.children = map[schema.GroupVersionKind]*childKind{}
	current := map[dynamic.WatchKey]bool{}
	for _, res := range w.rule.Resources {
		if res.Targets() {
			continue // its children are its places' (fleet.go)
		}
		if res.Mode != rules.ModePatch {
			for _, k := range res.Kinds {
				m := mappings[k.GVK]
				w.children[k.GVK] = &childKind{mapping: m, ns: w.childNamespace(k.GVK, m)}
			}
			continue
		}
		m := mappings[res.GVK]
		pw := &patchWatch{res: res, mapping: m, key: w.narrow(m, res.LiteralNamespace, res.LiteralName, "")}
		current[pw.key] = true
		w.patches = append(w.patches, pw)
	}
	for _, old := range w.retiredPatches {
		if !current[old.key] {
			current[old.key] = true
			w.patches = append(w.patches, &patchWatch{key: old.key, mapping: old.mapping})
		}
	}
	for i, l := range w.rule.Lookups {
		w.lookups = append(w.lookups, &lookupWatch{index: i, mapping: mappings[l.GVK]})
	}
	for _, gvk := range w.retired {
		if m, err := mapper.Mapping(ctx, gvk); err == nil && w.children[gvk] == nil {
			w.children[gvk] = &childKind{mapping: m, ns: w.ns, retired: true}
		}
	}
}

// limit says why the rule is kept to namespace w.ns: syncloop is limited
// to it, or the rule is a tenant rule of it.
func (w *watches) limit() string {
	if w.rule.Tenant == w.ns && w.rule.Tenant != "" {
		return fmt.Sprintf("the tenant rule is confined to namespace %q", w.ns)
	}
	return fmt.Sprintf("syncloop is limited to namespace %q (--watch-namespace)", w.ns)
}

// watchNamespace is the namespace the rule's triggers are watched in: the
// rule's own, else the engine's (empty: all).
func (w *watches) watchNamespace() string {
	return cmp.Or(w.rule.Watch.Namespace, w.ns)
}

// namespaced reports whether m's kind is namespaced.
func namespaced(m *meta.RESTMapping) bool { return m.Scope.Name() == meta.RESTScopeNameNamespace }

// checkNamespace reports why the rule cannot run in the engine's namespace,
// if the engine is limited to one.
func (w *watches) checkNamespace() error {
	ns := w.ns
	if ns == "" {
		return nil
	}
	limited := "but " + w.limit()
	watch := w.rule.Watch
	switch {
	case !namespaced(w.triggerMapping):
		return fmt.Errorf("it watches %s, which is cluster-scoped, %s", watch.Kind, limited)
	case watch.Namespace != "" && watch.Namespace != ns:
		return fmt.Errorf("it watches namespace %q, %s", watch.Namespace, limited)
	}
	for gvk, ck := range w.children {
		if !ck.retired && !namespaced(ck.mapping) {
			return fmt.Errorf("its children include %s, which is cluster-scoped, %s", gvk.Kind, limited)
		}
	}
	for _, pw := range w.patches {
		switch {
		case pw.res == nil:
		case !namespaced(pw.mapping):
			return fmt.Errorf("resource %q patches %s, which is cluster-scoped, %s", pw.res.ID, pw.res.Kind, limited)
		case pw.res.LiteralNamespace != "" && pw.res.LiteralNamespace != ns:
			return fmt.Errorf("resource %q patches namespace %q, %s", pw.res.ID, pw.res.LiteralNamespace, limited)
		}
	}
	for _, lw := range w.lookups {
		l := w.rule.Lookups[lw.index]
		switch {
		case !namespaced(lw.mapping):
			return fmt.Errorf("lookup %q reads %s, which is cluster-scoped, %s", l.ID, l.Kind, limited)
		case l.Namespace.IsLiteral() && l.Namespace.Literal != "" && l.Namespace.Literal != ns:
			return fmt.Errorf("lookup %q reads namespace %q, %s", l.ID, l.Namespace.Literal, limited)
		}
	}
	return nil
}

// narrow is the watch of m's objects narrowed to what is literal: a
// namespace (else the engine's, if it is limited to one), a name (as the
// field selector metadata.name=<name>) and a label selector; "" leaves
// each open. Patched objects carry no label of syncloop's to select them
// by, and a lookup's source none either: what the rule names literally is
// all the API server can be told.
func (w *watches) narrow(m *meta.RESTMapping, namespace, name, selector string) dynamic.WatchKey {
	key := dynamic.WatchKey{GVR: m.Resource, LabelSelector: selector}
	if namespaced(m) {
		key.Namespace = cmp.Or(namespace, w.ns)
	}
	if name != "" {
		key.FieldSelector = "metadata.name=" + name
	}
	return key
}

// triggerKey is the informer of the rule's triggers.
func (w *watches) triggerKey() dynamic.WatchKey {
	watch := w.rule.Watch
	key := dynamic.WatchKey{GVR: w.triggerMapping.Resource, LabelSelector: watch.LabelSelector.String(), FieldSelector: watch.FieldSelector.String()}
	if namespaced(w.triggerMapping) {
		key.Namespace = w.watchNamespace()
	}
	if w.filter {
		key.Filter = filterTriggers + w.rule.Name
	}
	return key
}

// childKey is the informer of one child kind of the rule: the
// installation's children (childrenSelector) labelled with the rule's
// name. A process caches only what its own rules made — not the children
// of rules it does not run, of removed rules or of other processes — and
// a rule's events reach only its own handlers. An object of a child's
// name that another rule (or nobody) made is not cached: the create-only
// apply finds it (applyChild), and it is a conflict, as before.
func (w *watches) childKey(ck *childKind) dynamic.WatchKey {
	sel := childrenSelector(w.rule.Installation) + "," + rules.LabelRule + "=" + w.rule.Name
	key := dynamic.WatchKey{GVR: ck.mapping.Resource, Namespace: ck.ns, LabelSelector: sel}
	if w.filter {
		key.Filter = filterChildren + w.rule.Name
	}
	return key
}

// childNamespace is where the informer of the rule's children of kind
// gvk (mapped by m) lists: the engine's namespace; else, when the rule
// acts as a ServiceAccount — whose RBAC may well be one namespace's — and
// puts every child of the kind in one namespace it names literally (or in
// its triggers' namespace, which it watches literally), that one; else
// every namespace.
func (w *watches) childNamespace(gvk schema.GroupVersionKind, m *meta.RESTMapping) string {
	if w.ns != "" || w.actor == nil || w.actor.id.IsZero() || !namespaced(m) {
		return w.ns
	}
	ns := ""
	for _, res := range w.rule.Resources {
		if !res.MayRender(gvk) || res.Mode == rules.ModePatch {
			continue
		}
		at := res.LiteralNamespace
		if res.NoNamespace && namespaced(w.triggerMapping) {
			at = w.rule.Watch.Namespace
		}
		if at == "" || (ns != "" && at != ns) {
			return ""
		}
		ns = at
	}
	return ns
}

// lookupKey is the informer a lookup reads from: what is the same for
// every trigger — a literal namespace, name and selector — is sent to the
// API server; a templated one is not, and the cache holds the kind
// wherever syncloop may read it.
func (w *watches) lookupKey(lw *lookupWatch) dynamic.WatchKey {
	l := w.rule.Lookups[lw.index]
	var namespace, name, selector string
	if l.Namespace.IsLiteral() {
		namespace = l.Namespace.Literal
	}
	if !l.List() && l.Name.IsLiteral() {
		name = l.Name.Literal
	}
	if l.LabelSelector.IsLiteral() && l.LabelSelector.Literal != "" {
		if sel, err := labels.Parse(l.LabelSelector.Literal); err == nil {
			selector = sel.String()
		}
	}
	return w.narrow(lw.mapping, namespace, name, selector)
}

// handlers are the loop's event handlers, one set per kind of informer.
type handlers struct {
	trigger, child cache.ResourceEventHandler
	lookup         func(lw *lookupWatch) cache.ResourceEventHandler
	patch          func(pw *patchWatch) cache.ResourceEventHandler
	// skip are child informers whose events another set of handlers of
	// the loop handles already: subscribed without handlers.
	skip map[dynamic.WatchKey]bool
}

// childKeys are the informers of the children's kinds.
func (w *watches) childKeys() map[dynamic.WatchKey]bool {
	out := map[dynamic.WatchKey]bool{}
	for _, ck := range w.children {
		out[w.childKey(ck)] = true
	}
	return out
}

// subscribe starts (or shares) every informer of the rule. An informer of
// a retired kind or patch watch that cannot start is skipped: best effort.
func (w *watches) subscribe(ctx context.Context, h handlers) error {
	registry := w.actor.registry
	sub, err := registry.Subscribe(ctx, w.triggerKey(), h.trigger)
	if err != nil {
		return err
	}
	w.trigger = sub
	for _, ck := range w.children {
		handler := h.child
		if key := w.childKey(ck); h.skip[key] {
			handler = cache.ResourceEventHandlerFuncs{}
		}
		sub, err := registry.Subscribe(ctx, w.childKey(ck), handler)
		switch {
		case err != nil && ck.retired:
			continue
		case err != nil:
			return err
		}
		ck.sub = sub
	}
	for _, lw := range w.lookups {
		sub, err := registry.Subscribe(ctx, w.lookupKey(lw), h.lookup(lw))
		if err != nil {
			return err
		}
		lw.sub = sub
	}
	for _, pw := range w.patches {
		sub, err := registry.Subscribe(ctx, pw.key, h.patch(pw))
		switch {
		case err != nil && pw.res == nil:
			continue
		case err != nil:
			return err
		}
		pw.sub = sub
	}
	return nil
}

// needed are the informers a worker needs synced before it reconciles:
// the children's (a reconcile needs every existing child to decide what
// to write and prune), the lookups' (a lookup read from a cache still
// listing would find nothing, and a rule's children could be pruned for
// it) and the patch resources'. Not the trigger's: a cold start does not
// wait for the whole list; nor the retired ones, whose kind may be gone.
func (w *watches) needed() []informer {
	var out []informer
	for _, ck := range w.children {
		if !ck.retired {
			out = append(out, ck.sub)
		}
	}
	for _, lw := range w.lookups {
		out = append(out, lw.sub)
	}
	for _, pw := range w.patches {
		if pw.res != nil {
			out = append(out, pw.sub)
		}
	}
	return out
}

// unsubscribe stops sharing every informer subscribed.
func (w *watches) unsubscribe() {
	var subs []informer
	if w.trigger != nil {
		subs = append(subs, w.trigger)
	}
	for _, ck := range w.children {
		subs = append(subs, ck.sub)
	}
	for _, lw := range w.lookups {
		subs = append(subs, lw.sub)
	}
	for _, pw := range w.patches {
		subs = append(subs, pw.sub)
	}
	for _, s := range subs {
		if s != nil {
			s.Stop()
		}
	}
}

// patchWatchOf is the watch of patch resource res.
func (w *watches) patchWatchOf(res *rules.Resource) *patchWatch {
	for _, pw := range w.patches {
		if pw.res == res {
			return pw
		}
	}
	panic(fmt.Sprintf("resource %q of rule %q has no patch watch", res.ID, w.rule.Name))
}

// patchMappingOf is the mapping of a patch watch of obj's kind; nil if none.
func (w *watches) patchMappingOf(gvk schema.GroupVersionKind) *meta.RESTMapping {
	for _, pw := range w.patches {
		if pw.mapping.GroupVersionKind == gvk {
			return pw.mapping
		}
	}
	return nil
}
