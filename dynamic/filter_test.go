package dynamic

import (
	"fmt"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	applycorev1 "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// TestRegistryFilter: an informer whose key has a Filter caches only what
// Keep keeps, whole, and shares nothing with the informer of the same
// objects without one, in JSON and in protobuf alike. When Keep's answer
// changes, an object that changes follows it at once — one it keeps no
// more leaves the cache (its handlers are sent a Delete), one it keeps now
// arrives (an Add) — and one that does not change stays as it was until
// Refresh lists again (or, kept no more, Drop lets it go). Events of
// objects neither kept nor cached reach no handler.
func TestRegistryFilter(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	client, err := NewClient(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	if !client.Protobuf().serves(t.Context(), configMaps) {
		t.Fatal("the API server does not serve ConfigMaps in protobuf: the test would try JSON twice")
	}
	for _, encoding := range []string{"json", "protobuf"} {
		t.Run(encoding, func(t *testing.T) {
			r := NewRegistry(client.Dynamic, nil)
			if encoding == "protobuf" {
				r.Protobuf = client.Protobuf()
			}
			testRegistryFilter(t, cs, r)
		})
	}
}

func testRegistryFilter(t *testing.T, cs kubernetes.Interface, r *Registry) {
	ns := newNamespace(t, cs)
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

	// Keep the even ones; after the flip, the odd ones.
	var odd atomic.Bool
	r.Keep = func(key WatchKey, m metav1.Object) bool {
		if key.Filter != "mine" {
			t.Errorf("Keep asked for key %v", key)
		}
		var n int
		fmt.Sscanf(m.GetName(), "cm-%d", &n)
		return (n%2 == 1) == odd.Load()
	}
	filtered := WatchKey{GVR: configMaps, Namespace: ns, Filter: "mine"}
	plain := WatchKey{GVR: configMaps, Namespace: ns}
	rec, fullRec := newRecorder(), newRecorder()
	sub, err := r.Subscribe(ctx, filtered, rec)
	if err != nil {
		t.Fatal(err)
	}
	full, err := r.Subscribe(ctx, plain, fullRec)
	if err != nil {
		t.Fatal(err)
	}
	if !sub.WaitForSync(ctx) || !full.WaitForSync(ctx) {
		t.Fatal("not synced")
	}
	if r.Len() != 2 {
		t.Fatalf("a key with a Filter and one without share an informer: %d running, want 2", r.Len())
	}
	// check fails unless the filtered cache holds exactly the objects
	// named in values (with those values), whole.
	check := func(when string, values map[int]string) {
		t.Helper()
		for i := range 6 {
			key := fmt.Sprintf("%s/cm-%d", ns, i)
			obj, ok, _ := sub.Indexer().GetByKey(key)
			value, want := values[i]
			if ok != want {
				t.Errorf("%s: %s cached: %v, want %v", when, key, ok, want)
			}
			if fobj, ok, _ := full.Indexer().GetByKey(key); !ok || fobj == nil {
				t.Errorf("%s: the informer without a Filter does not cache %s", when, key)
			}
			if !ok {
				continue
			}
			u, _ := ToUnstructured(obj)
			data, _, _ := unstructured.NestedString(u.Object, "data", "k")
			if data != value || u.GetLabels()["l"] != "v" || u.GetUID() == "" || u.GetResourceVersion() == "" || u.GetKind() != "ConfigMap" {
				t.Errorf("%s: %s is not whole: %v, want data %q", when, key, u.Object, value)
			}
		}
	}
	check("listed", map[int]string{0: "1", 2: "1", 4: "1"})
	if n := rec.count("add", "cm-1"); n != 0 {
		t.Errorf("the subscriber was sent %d Adds of cm-1, which Keep does not keep", n)
	}

	// Keep's answer changes: what changes follows it, the rest stays.
	odd.Store(true)
	apply("cm-0", "2") // kept no more: leaves the cache
	apply("cm-1", "2") // kept now: arrives
	poll(t, "the changes to arrive", func() bool { return rec.count("delete", "cm-0") == 1 && rec.count("add", "cm-1") == 1 })
	check("after the flip", map[int]string{1: "2", 2: "1", 4: "1"})

	adds := rec.count("add", "cm-3")
	if err := sub.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	check("refreshed", map[int]string{1: "2", 3: "1", 5: "1"})
	if rec.count("add", "cm-3") != adds+1 {
		t.Errorf("the subscriber was sent %d Adds of cm-3 by the refresh, want 1", rec.count("add", "cm-3")-adds)
	}
	if !sub.HasSynced() {
		t.Error("the subscription has not synced on the new informer")
	}
	if r.Len() != 2 {
		t.Errorf("%d informers run after a refresh, want 2", r.Len())
	}
	// Events come from the new informer, once each; those of an object
	// neither kept nor cached, none (the watch delivers in order: by the
	// time cm-5's arrives, cm-4's has been dealt with).
	before := rec.count("add", "cm-4") + rec.count("update", "cm-4") + rec.count("delete", "cm-4")
	apply("cm-4", "3")
	apply("cm-5", "3")
	poll(t, "the update after the refresh", func() bool { return rec.count("update", "cm-5") >= 1 && fullRec.count("update", "cm-4") >= 1 })
	if n := rec.count("update", "cm-5"); n != 1 {
		t.Errorf("cm-5 changed once, after the refresh, and the subscriber was sent %d updates of it, want 1", n)
	}
	if n := rec.count("add", "cm-4") + rec.count("update", "cm-4") + rec.count("delete", "cm-4") - before; n != 0 {
		t.Errorf("cm-4, neither kept nor cached, changed and the subscriber was sent %d events of it", n)
	}
	check("after the update", map[int]string{1: "2", 3: "1", 5: "3"})
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "cm-3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the delete after the refresh", func() bool { return rec.count("delete", "cm-3") == 1 })

	// Keep no more: Drop removes what it no longer keeps, in place.
	odd.Store(false)
	deletes := rec.count("delete", "cm-1")
	var gone []string
	if n := sub.Drop(func(obj any) { gone = append(gone, name(obj)) }); n != 2 || len(gone) != 2 {
		t.Errorf("Drop removed %d objects and told of %v, want 2 (cm-1, cm-5)", n, gone)
	}
	if n := sub.Drop(nil); n != 0 {
		t.Errorf("a second Drop removed %d objects, want 0", n)
	}
	if len(sub.Indexer().ListKeys()) != 0 {
		t.Errorf("after Drop the cache holds %v", sub.Indexer().ListKeys())
	}
	if rec.count("delete", "cm-1") != deletes {
		t.Error("Drop sent the subscriber a Delete")
	}
	// What changes after a Drop, kept no more, is not cached again.
	apply("cm-1", "4")
	apply("cm-2", "4") // kept: a sign that cm-1's event has been dealt with
	poll(t, "the update after the drop", func() bool { return rec.count("add", "cm-2") >= 1 })
	if _, ok, _ := sub.Indexer().GetByKey(ns + "/cm-1"); ok {
		t.Error("cm-1, dropped and changed since, is cached again")
	}

	sub.Stop()
	if err := r.Refresh(ctx, filtered); err != nil {
		t.Errorf("refreshing a key nobody subscribes: %v", err)
	}
	full.Stop()
	if r.Len() != 0 {
		t.Errorf("%d informers run after every subscriber left", r.Len())
	}
}
