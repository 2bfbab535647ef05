package engine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/render"
)

// This file is the reconciler without an API server: caches a test fills
// in, the writes the reconcile decides out. What the API server does with
// a write — server-side apply, selectors, garbage collection — is the
// integration tests'.

// kinds are the kinds the unit tests know, as discovery would map them.
var kinds = map[schema.GroupVersionKind]*meta.RESTMapping{}

func init() {
	for _, k := range []struct {
		gvk      schema.GroupVersionKind
		resource string
		scope    meta.RESTScope
	}{
		{schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, "configmaps", meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, "secrets", meta.RESTScopeNamespace},
		{schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, "namespaces", meta.RESTScopeRoot},
		{schema.GroupVersionKind{Group: "test.syncloop.dev", Version: "v1", Kind: "Widget"}, "widgets", meta.RESTScopeNamespace},
	} {
		kinds[k.gvk] = &meta.RESTMapping{Resource: k.gvk.GroupVersion().WithResource(k.resource), GroupVersionKind: k.gvk, Scope: k.scope}
	}
}

// staticMapper maps the kinds the unit tests know.
type staticMapper struct{}

func (staticMapper) Mapping(_ context.Context, gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	if m, ok := kinds[gvk]; ok {
		return m, nil
	}
	return nil, &meta.NoKindMatchError{GroupKind: gvk.GroupKind()}
}

func (staticMapper) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	m, ok := kinds[gvk]
	if !ok {
		return false, &meta.NoKindMatchError{GroupKind: gvk.GroupKind()}
	}
	return m.Scope == meta.RESTScopeNamespace, nil
}

// table is an informer's cache a test fills in: a store, and an informer
// whose lifecycle does nothing.
type table struct {
	idx      cache.Indexer
	unsynced bool // the first list has not arrived
}

func newTable() *table {
	return &table{idx: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{ownerIndex: ownerIndexFunc, ruleIndex: ruleIndexFunc, patchIndex: patchIndexFunc})}
}

func (t *table) Indexer() cache.Indexer        { return t.idx }
func (t *table) HasSynced() bool               { return !t.unsynced }
func (t *table) Synced() <-chan struct{}       { c := make(chan struct{}); close(c); return c }
func (t *table) LastError() error              { return nil }
func (t *table) Key() dynamic.WatchKey         { return dynamic.WatchKey{} }
func (t *table) Refresh(context.Context) error { return nil }
func (t *table) Drop(func(any)) int            { return 0 }
func (t *table) Stop()                         {}
func (t *table) put(objs ...*unstructured.Unstructured) {
	for _, o := range objs {
		if err := t.idx.Update(o); err != nil {
			panic(err)
		}
	}
}

// unit is one rule's reconciler over tables, writing to a recorder.
type unit struct {
	t   *testing.T
	rc  *reconciler
	out *recorder
	// server holds what the API server has that no cache does (objects
	// syncloop does not own), by kind and cache key.
	server map[string]*unstructured.Unstructured
	rv     int // the API server's last resourceVersion
}

// newUnit loads the one rule of yaml, in which NS is namespace "ns", and
// makes its reconciler over empty, synced tables.
func newUnit(t *testing.T, yaml string) *unit {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("unit.yaml", []byte(strings.ReplaceAll(yaml, "NS", "ns")))
	if err != nil {
		t.Fatal(err)
	}
	r := f.Rules[0]
	w := &watches{rule: r}
	mappings := map[schema.GroupVersionKind]*meta.RESTMapping{}
	for gvk, m := range kinds {
		mappings[gvk] = m
	}
	w.mapped(t.Context(), staticMapper{}, mappings)
	w.trigger = newTable()
	for _, ck := range w.children {
		ck.sub = newTable()
	}
	for _, lw := range w.lookups {
		lw.sub = newTable()
	}
	for _, pw := range w.patches {
		pw.sub = newTable()
	}
	u := &unit{t: t, server: map[string]*unstructured.Unstructured{}, rv: 100}
	u.rc = newReconciler(r, w, staticMapper{}, u, noMetrics{}, DefaultFightPolicy, func(writes *ownWrites) writer {
		u.out = &recorder{u: u, writes: writes}
		return u.out
	})
	return u
}

// triggers is the rule's trigger table.
func (u *unit) triggers() *table { return u.rc.w.trigger.(*table) }

// children is the rule's table of children of kind.
func (u *unit) children(kind string) *table {
	for gvk, ck := range u.rc.w.children {
		if gvk.Kind == kind {
			return ck.sub.(*table)
		}
	}
	u.t.Fatalf("the rule makes no %s", kind)
	return nil
}

// lookups is the table lookup id reads.
func (u *unit) lookups(id string) *table {
	for _, lw := range u.rc.w.lookups {
		if u.rc.rule.Lookups[lw.index].ID == id {
			return lw.sub.(*table)
		}
	}
	u.t.Fatalf("the rule has no lookup %q", id)
	return nil
}

// patched is the table of the objects patch resource id may patch.
func (u *unit) patched(id string) *table {
	for _, pw := range u.rc.w.patches {
		if pw.res != nil && pw.res.ID == id {
			return pw.sub.(*table)
		}
	}
	u.t.Fatalf("the rule has no patch resource %q", id)
	return nil
}

// reconcile reconciles trigger ns/name and returns the writes it made,
// and its error.
func (u *unit) reconcile(name string) ([]string, error) {
	u.out.lines = nil
	err := u.rc.reconcile(u.t.Context(), cache.ObjectName{Namespace: "ns", Name: name})
	return u.out.lines, err
}

// mustReconcile reconciles trigger t, which must not fail.
func (u *unit) mustReconcile() {
	u.t.Helper()
	if _, err := u.reconcile("t"); err != nil {
		u.t.Fatalf("reconcile: %v", err)
	}
}

// serve puts objects on the API server that no cache holds.
func (u *unit) serve(objs ...*unstructured.Unstructured) {
	for _, o := range objs {
		u.server[serverKey(refOf(o))] = o
	}
}

// changeTrigger changes the cached trigger ns/name, as a new version.
func (u *unit) changeTrigger(name string, change func(*unstructured.Unstructured)) {
	o, ok, _ := u.triggers().idx.GetByKey("ns/" + name)
	if !ok {
		return
	}
	t := wholeOf(o).DeepCopy()
	change(t)
	u.rv++
	t.SetResourceVersion(fmt.Sprint(u.rv))
	u.triggers().put(t)
}

// changeChild changes the cached child of kind ns/name, as a new version
// another writer made.
func (u *unit) changeChild(kind, name string, change func(*unstructured.Unstructured)) {
	tb := u.children(kind)
	o, ok, _ := tb.idx.GetByKey("ns/" + name)
	if !ok {
		u.t.Fatalf("no %s ns/%s is cached", kind, name)
	}
	c := wholeOf(o).DeepCopy()
	change(c)
	u.rv++
	c.SetResourceVersion(fmt.Sprint(u.rv))
	tb.put(c)
}

// Get implements liveReader: the caches' objects, then the server's.
func (u *unit) Get(_ context.Context, m *meta.RESTMapping, namespace, name string) (*unstructured.Unstructured, error) {
	ref := childRef{gvk: m.GroupVersionKind, namespace: namespace, name: name}
	if o, ok := u.server[serverKey(ref)]; ok {
		return o.DeepCopy(), nil
	}
	if ck := u.rc.w.children[m.GroupVersionKind]; ck != nil {
		if o, ok, _ := ck.sub.Indexer().GetByKey(cacheKey(ref)); ok {
			return wholeOf(o).DeepCopy(), nil
		}
	}
	if m.GroupVersionKind == u.rc.w.triggerMapping.GroupVersionKind {
		if o, ok, _ := u.rc.w.trigger.Indexer().GetByKey(cacheKey(ref)); ok {
			return wholeOf(o).DeepCopy(), nil
		}
	}
	return nil, apierrors.NewNotFound(m.Resource.GroupResource(), name)
}

func serverKey(ref childRef) string { return ref.gvk.Kind + ":" + cacheKey(ref) }

// object is an object of kind in namespace ns, with a UID of its name.
func obj(kind, name string, labels, data map[string]string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{}
	for gvk := range kinds {
		if gvk.Kind == kind {
			o.SetGroupVersionKind(gvk)
		}
	}
	if kinds[o.GroupVersionKind()].Scope == meta.RESTScopeNamespace {
		o.SetNamespace("ns")
	}
	o.SetName(name)
	o.SetUID(types.UID("uid-" + name))
	o.SetResourceVersion("1")
	o.SetLabels(labels)
	if data != nil {
		d := map[string]any{}
		for k, v := range data {
			d[k] = v
		}
		o.Object["data"] = d
	}
	return o
}

// recorder is the writer of the unit tests: each write and note is a
// line, and a write is answered as the API server would, the child's
// table then holding what it applied.
type recorder struct {
	u      *unit
	writes *ownWrites
	lines  []string
}

func (r *recorder) note(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *recorder) apply(_ context.Context, w *write) (map[string]any, error) {
	ref := w.ref()
	if w.before == nil && w.obj.GetResourceVersion() == createOnlyVersion {
		if _, taken := r.u.server[serverKey(ref)]; taken {
			return nil, apierrors.NewConflict(w.mapping.Resource.GroupResource(), ref.name, fmt.Errorf("the object has been modified"))
		}
	}
	what := map[writeKind]string{writeChild: w.action, writePatch: "patch", writeRelease: "release"}[w.kind]
	r.note("%s %s %s", what, ref.gvk.Kind, cacheKey(ref))
	out := w.obj.DeepCopy()
	r.u.rv++
	out.SetResourceVersion(fmt.Sprint(r.u.rv))
	if w.kind != writeChild {
		return out.Object, nil
	}
	out.SetUID(types.UID("uid-" + ref.name))
	delete(r.u.server, serverKey(ref))
	// What liveWriter remembers of its own writes.
	r.writes.applying(ref)
	r.writes.applyDone(ref, out.GetResourceVersion())
	if w.before != nil {
		r.writes.replacedWith(ref, w.before.GetResourceVersion(), rules.Annotation(w.obj, rules.AnnotationAppliedHash))
	}
	r.u.children(ref.gvk.Kind).put(out)
	return out.Object, nil
}

func (r *recorder) delete(_ context.Context, m *meta.RESTMapping, _ rules.ObjectRef, child object, _ *changes, propagation metav1.DeletionPropagation) error {
	ref := refOf(child)
	if !r.writes.deleting(ref, child.GetUID()) {
		return nil
	}
	r.writes.deleteDone(ref)
	r.note("delete %s %s%s", m.GroupVersionKind.Kind, cacheKey(ref), map[metav1.DeletionPropagation]string{metav1.DeletePropagationForeground: " (foreground)"}[propagation])
	return r.u.children(m.GroupVersionKind.Kind).idx.Delete(child)
}

func (r *recorder) status(_ context.Context, _ *meta.RESTMapping, trigger, patch *unstructured.Unstructured, _ string) error {
	conds, _, _ := unstructured.NestedSlice(patch.Object, "status", "conditions")
	var said []string
	for _, c := range conds {
		c := c.(map[string]any)
		said = append(said, fmt.Sprintf("%s=%s/%s", c["type"], c["status"], c["reason"]))
	}
	r.note("status %s %s", trigger.GetName(), strings.Join(said, ","))
	r.u.changeTrigger(trigger.GetName(), func(t *unstructured.Unstructured) { t.Object["status"] = patch.Object["status"] })
	return nil
}

func (r *recorder) mark(_ context.Context, _ *meta.RESTMapping, patch *unstructured.Unstructured, _ string) error {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range patch.GetAnnotations() {
			if !yield(k) {
				return
			}
		}
	})
	r.note("mark %s finalizers=%v annotations=%v", patch.GetName(), patch.GetFinalizers(), keys)
	// As the trigger's cache shows it: the marks a manager applies are
	// those it owns (one manager per mark).
	r.u.changeTrigger(patch.GetName(), func(t *unstructured.Unstructured) {
		a := t.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		maps.Copy(a, patch.GetAnnotations())
		t.SetAnnotations(a)
		for _, f := range patch.GetFinalizers() {
			if !slices.Contains(t.GetFinalizers(), f) {
				t.SetFinalizers(append(t.GetFinalizers(), f))
			}
		}
	})
	return nil
}

func (r *recorder) unfinalize(_ context.Context, _ *meta.RESTMapping, trigger *unstructured.Unstructured, finalizer string) error {
	r.note("unfinalize %s %s", trigger.GetName(), finalizer)
	r.u.changeTrigger(trigger.GetName(), func(t *unstructured.Unstructured) {
		t.SetFinalizers(slices.DeleteFunc(t.GetFinalizers(), func(f string) bool { return f == finalizer }))
	})
	return nil
}

func (r *recorder) tearingDown(trigger *unstructured.Unstructured, msg string) {
	r.note("tearing down %s: %s", trigger.GetName(), msg)
}
func (r *recorder) wait(_ *unstructured.Unstructured, st *render.ResourceState) {
	r.note("wait %s", st.Resource.ID)
}
func (r *recorder) unreachable(_ *unstructured.Unstructured, child render.Child, ue *render.UnreachableError) {
	r.note("unreachable %s in %s: %s", child.Object.GetName(), ue.Cluster, ue.Why)
}
func (r *recorder) conflict(_ *unstructured.Unstructured, ce *render.ConflictError) {
	r.note("conflict %s %s: %s", ce.Object.Kind, ce.Object.Name, ce.Why)
}
func (r *recorder) failed(*unstructured.Unstructured, error) {}
func (r *recorder) contended(_ *unstructured.Unstructured, ce *render.ContendedError) {
	r.note("contended %s", ce.Object.Name)
}
func (r *recorder) held(_ *unstructured.Unstructured, h leaveHold) {
	r.note("held %d in %s", len(h.children), h.cluster)
}
func (r *recorder) reconciled(*unstructured.Unstructured, *changes) {}
func (r *recorder) ended(_ cache.ObjectName, err error) error       { return err }
func (r *recorder) dryRun() bool                                    { return false }

// TestGoneAlready: a delete answered 404 or 409 about the object itself
// means it is gone (or replaced); a 404 naming nothing — an API server
// starting up, not serving the path yet — does not: the delete is made
// again, never assumed.
func TestGoneAlready(t *testing.T) {
	cm := schema.GroupResource{Resource: "configmaps"}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewNotFound(cm, "web"), true},
		{apierrors.NewConflict(cm, "web", fmt.Errorf("precondition failed: UID in precondition: a, UID in object meta: b")), true},
		{&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404, Reason: metav1.StatusReasonNotFound,
			Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}}, false},
		{apierrors.NewServiceUnavailable("starting"), false},
		{fmt.Errorf("dial tcp: connection refused"), false},
	} {
		if got := goneAlready(c.err); got != c.want {
			t.Errorf("goneAlready(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
