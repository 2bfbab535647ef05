package dynamic

import (
	"fmt"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// TestRegistryStubs: an informer whose key has Stubs caches whole what
// Keep keeps and a stub of the rest — name, uid and resourceVersion, no
// data, labels or annotations — and shares nothing with the informer of
// the same objects without Stubs. What Keep answers after a list takes
// hold for objects cached before only on Refresh, which swaps the
// informer under the subscriptions without losing their events.
func TestRegistryStubs(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs)
	dc, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	apply := func(name, value string) {
		t.Helper()
		cm := applycorev1.ConfigMap(name, ns).WithLabels(map[string]string{"l": "v"}).
			WithAnnotations(map[string]string{"a": "v"}).WithData(map[string]string{"k": value})
		if _, err := cs.CoreV1().ConfigMaps(ns).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		apply(fmt.Sprintf("cm-%d", i), "1")
	}

	// Keep the even ones whole; after the flip, the odd ones.
	var odd atomic.Bool
	r := NewRegistry(dc, nil)
	r.Keep = func(key WatchKey, u *unstructured.Unstructured) (bool, string) {
		if key.Stubs != "mine" {
			t.Errorf("Keep asked for key %v", key)
		}
		var n int
		fmt.Sscanf(u.GetName(), "cm-%d", &n)
		return (n%2 == 1) == odd.Load(), "note"
	}
	stubbing := WatchKey{GVR: configMaps, Namespace: ns, Stubs: "mine"}
	plain := WatchKey{GVR: configMaps, Namespace: ns}
	rec := newRecorder()
	sub, err := r.Subscribe(ctx, stubbing, rec)
	if err != nil {
		t.Fatal(err)
	}
	full, err := r.Subscribe(ctx, plain, newRecorder())
	if err != nil {
		t.Fatal(err)
	}
	if !sub.WaitForSync(ctx) || !full.WaitForSync(ctx) {
		t.Fatal("not synced")
	}
	if r.Len() != 2 {
		t.Fatalf("a key with Stubs and one without share an informer: %d running, want 2", r.Len())
	}
	check := func(when string, wholeOdd bool, values map[int]string) {
		t.Helper()
		for i := range 6 {
			key := fmt.Sprintf("%s/cm-%d", ns, i)
			obj, ok, _ := sub.Indexer().GetByKey(key)
			if !ok {
				t.Errorf("%s: %s is not cached", when, key)
				continue
			}
			u := obj.(*unstructured.Unstructured)
			whole := (i%2 == 1) == wholeOdd
			if IsStub(u) == whole {
				t.Errorf("%s: %s cached as a stub: %v, want %v", when, key, IsStub(u), !whole)
			}
			if u.GetUID() == "" || u.GetResourceVersion() == "" || u.GetName() != fmt.Sprintf("cm-%d", i) || u.GetNamespace() != ns || u.GetKind() != "ConfigMap" {
				t.Errorf("%s: %s lacks its identity: %v", when, key, u.Object)
			}
			data, _, _ := unstructured.NestedString(u.Object, "data", "k")
			value := values[i]
			if value == "" {
				value = "1"
			}
			switch {
			case whole && (data != value || u.GetLabels()["l"] != "v"):
				t.Errorf("%s: whole %s has data %q and labels %v, want %q", when, key, data, u.GetLabels(), value)
			case !whole && (data != "" || len(u.GetLabels()) != 0 || len(u.GetAnnotations()) != 0):
				t.Errorf("%s: stub %s keeps more than its identity: %v", when, key, u.Object)
			}
			fobj, _, _ := full.Indexer().GetByKey(key)
			if IsStub(fobj) {
				t.Errorf("%s: the informer without Stubs caches a stub of %s", when, key)
			}
		}
	}
	check("listed", false, nil)

	// Keep's answer changes: objects cached before stay as they were
	// until they change or are listed again.
	odd.Store(true)
	apply("cm-0", "2") // now a stub
	apply("cm-1", "2") // now whole
	poll(t, "the updates to arrive", func() bool { return rec.count("update", "cm-0") == 1 && rec.count("update", "cm-1") == 1 })
	for name, stub := range map[string]bool{"cm-0": true, "cm-1": false, "cm-2": false, "cm-3": true} {
		obj, _, _ := sub.Indexer().GetByKey(ns + "/" + name)
		if IsStub(obj) != stub {
			t.Errorf("after the flip, %s is a stub: %v, want %v", name, IsStub(obj), stub)
		}
	}

	adds := rec.count("add", "cm-4")
	if err := sub.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	check("refreshed", true, map[int]string{0: "2", 1: "2"})
	if rec.count("add", "cm-4") != adds+1 {
		t.Errorf("the subscriber was sent %d Adds of cm-4 by the refresh, want 1", rec.count("add", "cm-4")-adds)
	}
	if !sub.HasSynced() {
		t.Error("the subscription has not synced on the new informer")
	}
	if r.Len() != 2 {
		t.Errorf("%d informers run after a refresh, want 2", r.Len())
	}
	// Events come from the new informer, once each.
	apply("cm-5", "3")
	poll(t, "the update after the refresh", func() bool { return rec.count("update", "cm-5") >= 1 })
	if n := rec.count("update", "cm-5"); n != 1 {
		t.Errorf("cm-5 changed once, after the refresh, and the subscriber was sent %d updates of it, want 1", n)
	}
	obj, _, _ := sub.Indexer().GetByKey(ns + "/cm-5")
	if v, _, _ := unstructured.NestedString(obj.(*unstructured.Unstructured).Object, "data", "k"); v != "3" {
		t.Errorf("cm-5 is cached with %q after the refresh, want 3", v)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "cm-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the delete after the refresh", func() bool { return rec.count("delete", "cm-2") == 1 })

	// Keep no more: Restub makes the whole ones it no longer keeps stubs
	// in place, with Keep's note, and leaves the rest as they are.
	odd.Store(false)
	if n := sub.Restub(); n != 3 {
		t.Errorf("Restub replaced %d objects, want 3 (cm-1, cm-3, cm-5)", n)
	}
	for i, stub := range map[int]bool{0: true, 1: true, 3: true, 4: true, 5: true} {
		obj, _, _ := sub.Indexer().GetByKey(fmt.Sprintf("%s/cm-%d", ns, i))
		if IsStub(obj) != stub || StubNote(obj) != "note" {
			t.Errorf("after Restub, cm-%d is a stub: %v with note %q, want a stub with note %q", i, IsStub(obj), StubNote(obj), "note")
		}
	}
	if n := sub.Restub(); n != 0 {
		t.Errorf("a second Restub replaced %d objects, want 0", n)
	}

	sub.Stop()
	if err := r.Refresh(ctx, stubbing); err != nil {
		t.Errorf("refreshing a key nobody subscribes: %v", err)
	}
	full.Stop()
	if r.Len() != 0 {
		t.Errorf("%d informers run after every subscriber left", r.Len())
	}
}
