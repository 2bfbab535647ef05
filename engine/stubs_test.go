package engine

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/testenv"
)

// pendingShardFunc is a shardFunc that is a placeholder (pendingShard).
type pendingShardFunc struct{ shardFunc }

func (pendingShardFunc) Pending() bool { return true }

// TestShardStubs: a sharded engine caches whole only the triggers its
// shard owns and their children, and stubs of the rest; when the shard
// changes it lists again, so that what it gained is whole and what it lost
// is stubs, and it reconciles what it gained from whole objects — a
// trigger changed and a child deleted while another replica owned them
// are repaired, and what did not change is not written again.
func TestShardStubs(t *testing.T) {
	h := newHarness(t)
	h.shard = allShard
	h.limitNS = h.ns // the caches hold this test's objects only
	h.start(h.loadRules(copyRule))
	even, odd := h.evenAndOdd(24)
	c := h.loop("copy")
	h.eventually("every child", func() bool {
		for _, n := range append(append([]string{}, even...), odd...) {
			if _, ok := h.configMap(h.ns, n+"-copy"); !ok {
				return false
			}
		}
		return true
	})
	h.eventually("the engine to be idle", c.idle)
	children := c.watches.children[schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}].sub
	if !strings.Contains(c.watches.trigger.Key().Stubs, "copy") || !strings.Contains(children.Key().Stubs, "copy") {
		t.Fatalf("the rule's informers do not stub: %v, %v", c.watches.trigger.Key(), children.Key())
	}
	// stubs says which of names are cached as stubs, trigger and child
	// alike, and fails on a trigger whose child is not like it.
	stubs := func(when string, names []string) (n int) {
		t.Helper()
		for _, name := range names {
			tr, ok1, _ := c.watches.trigger.Indexer().GetByKey(h.ns + "/" + name)
			ch, ok2, _ := children.Indexer().GetByKey(h.ns + "/" + name + "-copy")
			if !ok1 || !ok2 {
				t.Errorf("%s: %s or its child is not cached (%v, %v)", when, name, ok1, ok2)
				continue
			}
			if dynamic.IsStub(tr) != dynamic.IsStub(ch) {
				t.Errorf("%s: trigger %s is a stub: %v, its child: %v", when, name, dynamic.IsStub(tr), dynamic.IsStub(ch))
			}
			if dynamic.IsStub(tr) {
				n++
			}
		}
		return n
	}
	if n := stubs("owning all", append(append([]string{}, even...), odd...)); n != 0 {
		t.Errorf("owning every trigger, %d are cached as stubs", n)
	}

	// Losing the odd ones: stubbed in place, without a list.
	refreshes, restubs := c.refreshes.Load(), c.restubs.Load()
	h.counter.Reset()
	h.engine.SetShard(t.Context(), evenShard)
	h.eventually("the lost triggers stubbed", func() bool { return c.restubs.Load() > restubs })
	h.eventually("the engine to be idle", c.idle)
	if c.refreshes.Load() != refreshes {
		t.Error("losing triggers, and gaining none, listed the informers again")
	}
	if l := h.counter.Requests(func(r testenv.Request) bool { return r.Method == "GET" && strings.HasSuffix(r.Path, "/configmaps") }); len(l) != 0 {
		t.Errorf("losing triggers listed or watched ConfigMaps %d times", len(l))
	}
	if n := stubs("owning the even ones", odd); n != len(odd) {
		t.Errorf("the shard lost %d triggers and %d of them are cached as stubs", len(odd), n)
	}
	if n := stubs("owning the even ones", even); n != 0 {
		t.Errorf("%d of the triggers the shard kept are cached as stubs", n)
	}
	if w := h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }); len(w) != 0 {
		t.Errorf("losing triggers wrote %d requests, first %s %s", len(w), w[0].Method, w[0].Path)
	}
	if got := h.engine.Owned()["copy"]; got != len(even) {
		t.Errorf("Owned()[copy] = %d, want %d", got, len(even))
	}
	if got, want := h.engine.Cached()["copy"], (CachedObjects{Whole: 2 * len(even), Stubs: 2 * len(odd)}); got != want {
		t.Errorf("Cached()[copy] = %+v, want %+v", got, want)
	}

	// While another replica owns them: one odd trigger changes, another's
	// child is deleted. Nobody repairs them here.
	changed, deleted := odd[0], odd[len(odd)-1]
	h.updateCM(changed, func(cm *corev1.ConfigMap) { cm.Data["k"] = "changed" })
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), deleted+"-copy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the changed trigger's stub", func() bool {
		obj, ok, _ := c.watches.trigger.Indexer().GetByKey(h.ns + "/" + changed)
		return ok && dynamic.IsStub(obj) && obj.(interface{ GetResourceVersion() string }).GetResourceVersion() != ""
	})
	h.eventually("the engine to be idle", c.idle)
	if cm, _ := h.configMap(h.ns, changed+"-copy"); cm.Data["k"] != "v" {
		t.Fatalf("an engine that does not own %s updated its child", changed)
	}

	// Gaining them back: whole again, and repaired from whole objects.
	h.counter.Reset()
	refreshes = c.refreshes.Load()
	h.engine.SetShard(t.Context(), allShard)
	h.eventually(changed+"-copy updated and "+deleted+"-copy made again", func() bool {
		cm, ok := h.configMap(h.ns, changed+"-copy")
		_, made := h.configMap(h.ns, deleted+"-copy")
		return ok && cm.Data["k"] == "changed" && made
	})
	h.eventually("the informers listed again", func() bool { return c.refreshes.Load() > refreshes })
	h.eventually("the engine to be idle", c.idle)
	if n := stubs("owning all again", append(append([]string{}, even...), odd...)); n != 0 {
		t.Errorf("owning every trigger again, %d are cached as stubs", n)
	}
	for _, r := range h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }) {
		if !strings.HasSuffix(r.Path, "/"+changed+"-copy") && !strings.HasSuffix(r.Path, "/"+deleted+"-copy") {
			t.Errorf("gaining triggers wrote what needed no write: %s %s", r.Method, r.Path)
		}
	}
	if n := len(h.events("ChildConflict")); n != 0 {
		t.Errorf("gaining triggers cached as stubs made %d conflict Events", n)
	}

	// A trigger that stopped matching while another replica owned it, the
	// only one gained back: no cached trigger says so, its child's stub
	// does; the informers list again and the sweep prunes the orphan.
	orphan := even[0]
	orphanKey := cache.ObjectName{Namespace: h.ns, Name: orphan}
	restubs = c.restubs.Load()
	h.engine.SetShard(t.Context(), shardFunc(func(_ string, d uint64) bool { return d != TriggerDigest(orphanKey) }))
	h.eventually("the lost trigger stubbed", func() bool { return c.restubs.Load() > restubs })
	h.updateCM(orphan, func(cm *corev1.ConfigMap) { cm.Labels["copy"] = "no" })
	h.eventually("the trigger to leave the cache", func() bool {
		_, ok, _ := c.watches.trigger.Indexer().GetByKey(orphanKey.String())
		return !ok
	})
	h.eventually("the engine to be idle", c.idle)
	if _, ok := h.configMap(h.ns, orphan+"-copy"); !ok {
		t.Fatalf("an engine that does not own %s pruned its child", orphan)
	}
	refreshes = c.refreshes.Load()
	h.engine.SetShard(t.Context(), allShard)
	h.eventually(orphan+"-copy pruned by the replica that gained its trigger", func() bool {
		_, ok := h.configMap(h.ns, orphan+"-copy")
		return !ok
	})
	if c.refreshes.Load() <= refreshes {
		t.Error("gaining only an orphan's trigger did not list the informers again")
	}
}

// TestShardPendingWaits: while the shard is a placeholder (a replica that
// has not joined), a rule whose informers stub lists nothing: it lists
// once, when the replica is given its share.
func TestShardPendingWaits(t *testing.T) {
	h := newHarness(t)
	h.shard = pendingShardFunc{noShard}
	h.createCM("early", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.startWith(h.loadRules(copyRule), false)
	h.eventually("the rule to wait for its share", func() bool {
		h.engine.mu.Lock()
		l := h.engine.loops["copy"]
		h.engine.mu.Unlock()
		if l == nil {
			return false
		}
		state, detail := l.getState()
		return state == StateSyncing && strings.Contains(detail, "share")
	})
	// A list is a GET without watch, or a watch that begins with the
	// objects there (client-go's watch-list).
	lists := func() int {
		return len(h.counter.Requests(func(r testenv.Request) bool {
			return r.Method == "GET" && strings.HasSuffix(r.Path, "/configmaps") && (!r.Watch || strings.Contains(r.Query, "sendInitialEvents=true"))
		}))
	}
	if n := lists(); n != 0 {
		t.Errorf("a rule waiting for its share listed %d times", n)
	}
	h.engine.SetShard(t.Context(), allShard)
	h.eventually("the child of a trigger there before", func() bool { _, ok := h.configMap(h.ns, "early-copy"); return ok })
	h.eventually("the engine to be idle", h.loop("copy").idle)
	if n := lists(); n != 2 {
		t.Errorf("given its share, the rule listed %d times, want 2 (its triggers and its children, once each)", n)
	}
	if n := h.loop("copy").refreshes.Load(); n != 0 {
		t.Errorf("given its first share, the rule listed again %d times, want 0", n)
	}
}
