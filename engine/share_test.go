package engine

import (
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/testenv"
)

// pendingShardFunc is a shardFunc that is a placeholder (Shard.Pending).
type pendingShardFunc struct{ shardFunc }

func (pendingShardFunc) Pending() bool { return true }

// shareHarness is a harness whose copy rule runs sharded over triggers
// even and odd, with every child made.
type shareHarness struct {
	*harness
	c         *ruleLoop
	children  *dynamic.Subscription
	even, odd []string
}

func newShareHarness(t *testing.T, n int) *shareHarness {
	h := newHarness(t)
	h.shard = allShard
	h.limitNS = h.ns // the caches hold this test's objects only
	h.start(h.loadRules(copyRule))
	even, odd := h.evenAndOdd(n)
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
	children := c.watches.children[schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}].sub.(*dynamic.Subscription)
	if !strings.Contains(c.watches.trigger.Key().Filter, "copy") || !strings.Contains(children.Key().Filter, "copy") {
		t.Fatalf("the rule's informers do not filter: %v, %v", c.watches.trigger.Key(), children.Key())
	}
	return &shareHarness{harness: h, c: c, children: children, even: even, odd: odd}
}

// cached counts which of names are cached, trigger or child, and — said
// when, a settled state — fails on a trigger cached without its child or
// the other way round. Polled while a shard changes (when ""), it does
// not: the two informers drop and list their objects each in its turn.
func (h *shareHarness) cached(when string, names []string) (n int) {
	h.t.Helper()
	for _, name := range names {
		_, tr, _ := h.c.watches.trigger.Indexer().GetByKey(h.ns + "/" + name)
		_, ch, _ := h.children.Indexer().GetByKey(h.ns + "/" + name + "-copy")
		if tr != ch && when != "" {
			h.t.Errorf("%s: trigger %s is cached: %v, its child: %v", when, name, tr, ch)
		}
		if tr || ch {
			n++
		}
	}
	return n
}

// watchedPast waits until sub's watch has dealt with every event up to
// resourceVersion rv, those of objects it does not cache among them.
func (h *shareHarness) watchedPast(what string, sub *dynamic.Subscription, rv string) {
	h.t.Helper()
	want, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		h.t.Fatal(err)
	}
	h.eventually(what, func() bool {
		got, err := strconv.ParseUint(sub.LastSyncResourceVersion(), 10, 64)
		return err == nil && got >= want
	})
}

// isList is a list of ConfigMaps: a GET without watch, or a watch that
// begins with the objects there (client-go's watch-list).
func isList(r testenv.Request) bool {
	return r.Method == "GET" && strings.HasSuffix(r.Path, "/configmaps") && (!r.Watch || strings.Contains(r.Query, "sendInitialEvents=true"))
}

// TestShardFilters: a sharded engine caches only the triggers its shard
// owns and their children; when the shard only loses triggers it drops
// them in place, without a request; when it gains some it lists again,
// and reconciles what it gained from the new lists — a trigger changed, a
// child deleted and a trigger that stopped matching while another replica
// owned them are repaired and pruned, and what did not change is not
// written again.
//
// API server: the objects informers receive and drop by shard.
func TestShardFilters(t *testing.T) {
	h := newShareHarness(t, 24)
	c, even, odd := h.c, h.even, h.odd
	all := append(append([]string{}, even...), odd...)
	if n := h.cached("owning all", all); n != len(all) {
		t.Errorf("owning every trigger, %d of %d are cached", n, len(all))
	}

	// Losing the odd ones: dropped in place, without a list.
	refreshes, drops := c.refreshes.Load(), c.drops.Load()
	h.counter.Reset()
	h.engine.SetShard(t.Context(), evenShard)
	h.eventually("the lost triggers dropped", func() bool { return h.cached("", odd) == 0 })
	h.eventually("the engine to be idle", c.idle)
	if c.drops.Load() == drops || c.refreshes.Load() != refreshes {
		t.Errorf("losing triggers, and gaining none: %d drops and %d lists, want some and none", c.drops.Load()-drops, c.refreshes.Load()-refreshes)
	}
	if l := h.counter.Requests(isList); len(l) != 0 {
		t.Errorf("losing triggers listed ConfigMaps %d times", len(l))
	}
	if n := h.cached("owning the even ones", even); n != len(even) {
		t.Errorf("%d of the %d triggers the shard kept are cached", n, len(even))
	}
	if w := h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }); len(w) != 0 {
		t.Errorf("losing triggers wrote %d requests, first %s %s", len(w), w[0].Method, w[0].Path)
	}
	if got := h.engine.Owned()["copy"]; got != len(even) {
		t.Errorf("Owned()[copy] = %d, want %d", got, len(even))
	}
	if got := h.engine.Cached()["copy"]; got != 2*len(even) {
		t.Errorf("Cached()[copy] = %d, want %d", got, 2*len(even))
	}

	// While another replica owns them: one odd trigger changes, another's
	// child is deleted, a third stops matching. Nobody repairs them here,
	// and none of it is cached.
	changed, deleted, orphan := odd[0], odd[len(odd)-1], odd[1]
	h.updateCM(changed, func(cm *corev1.ConfigMap) { cm.Data["k"] = "changed" })
	h.updateCM(orphan, func(cm *corev1.ConfigMap) { cm.Labels["copy"] = "no" })
	tr, _ := h.configMap(h.ns, orphan)
	h.watchedPast("the trigger watch past the changes", c.watches.trigger.(*dynamic.Subscription), tr.ResourceVersion)
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), deleted+"-copy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.updateCM(even[0]+"-copy", func(cm *corev1.ConfigMap) { cm.Annotations["note"] = "after the delete" })
	ch, _ := h.configMap(h.ns, even[0]+"-copy")
	h.watchedPast("the child watch past the delete", h.children, ch.ResourceVersion)
	h.eventually("the engine to be idle", c.idle)
	if n := h.cached("owning the even ones", odd); n != 0 {
		t.Errorf("%d triggers of another replica's are cached after they changed", n)
	}
	if cm, _ := h.configMap(h.ns, changed+"-copy"); cm.Data["k"] != "v" {
		t.Fatalf("an engine that does not own %s updated its child", changed)
	}
	if _, ok := h.configMap(h.ns, orphan+"-copy"); !ok {
		t.Fatalf("an engine that does not own %s pruned its child", orphan)
	}

	// Gaining them back: listed again, and repaired from the new lists.
	h.counter.Reset()
	h.engine.SetShard(t.Context(), allShard)
	h.eventually(changed+"-copy updated, "+deleted+"-copy made again and "+orphan+"-copy pruned", func() bool {
		cm, ok := h.configMap(h.ns, changed+"-copy")
		_, made := h.configMap(h.ns, deleted+"-copy")
		_, left := h.configMap(h.ns, orphan+"-copy")
		return ok && cm.Data["k"] == "changed" && made && !left
	})
	h.eventually("the informers listed again", func() bool { return c.refreshes.Load() > refreshes })
	h.eventually("the engine to be idle", c.idle)
	var rest []string
	for _, n := range all {
		if n != orphan {
			rest = append(rest, n)
		}
	}
	if n := h.cached("owning all again", rest); n != len(rest) {
		t.Errorf("owning every trigger again, %d of %d are cached", n, len(rest))
	}
	for _, r := range h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }) {
		if !strings.HasSuffix(r.Path, "/"+changed+"-copy") && !strings.HasSuffix(r.Path, "/"+deleted+"-copy") && !strings.HasSuffix(r.Path, "/"+orphan+"-copy") {
			t.Errorf("gaining triggers wrote what needed no write: %s %s", r.Method, r.Path)
		}
	}
	if n := len(h.events("ChildConflict")); n != 0 {
		t.Errorf("gaining triggers made %d conflict Events", n)
	}
}

// TestShardGainWaits: while the informers of a shard that gained triggers
// have not listed them — the API server slow to answer — the rule's
// reconciles wait: a gained trigger is not cached yet and would read as
// deleted, its children as orphans to prune. Once the lists are in, what
// changed is repaired, and nothing was deleted.
//
// API server: a slow list (the test's request filter delays it).
func TestShardGainWaits(t *testing.T) {
	h := newShareHarness(t, 12)
	c, odd := h.c, h.odd
	h.engine.SetShard(t.Context(), evenShard)
	h.eventually("the lost triggers dropped", func() bool { return h.cached("", odd) == 0 })
	h.eventually("the engine to be idle", c.idle)

	slow := h.counter.Stall(isList)
	defer slow.Release()
	h.counter.Reset()
	refreshes, holds, reconciles := c.refreshes.Load(), c.holds.Load(), c.reconciles.Load()
	h.engine.SetShard(t.Context(), allShard)
	h.eventually("the list for the gain to be under way", func() bool { return slow.Waiting() > 0 })
	// A gained trigger's child drifts: its event, kept now, queues the
	// trigger, which the cache does not hold yet.
	drifted := odd[0]
	h.updateCM(drifted+"-copy", func(cm *corev1.ConfigMap) { cm.Data["k"] = "drift" })
	h.eventually("the gained trigger taken from the queue", func() bool { return c.holds.Load() > holds || c.reconciles.Load() > reconciles })
	if _, ok := h.configMap(h.ns, drifted+"-copy"); !ok {
		t.Fatalf("%s-copy, of a trigger gained and not listed yet, was deleted", drifted)
	}
	if n := c.reconciles.Load() - reconciles; n != 0 {
		t.Errorf("%d reconciles ran before the list for the gain was in", n)
	}
	if c.refreshes.Load() != refreshes {
		t.Fatal("the informers listed again while the API server did not answer")
	}

	slow.Release()
	h.eventually(drifted+"-copy repaired", func() bool {
		cm, ok := h.configMap(h.ns, drifted+"-copy")
		return ok && cm.Data["k"] == "v"
	})
	h.eventually("the engine to be idle", c.idle)
	if d := h.counter.Requests(func(r testenv.Request) bool { return r.Method == "DELETE" }); len(d) != 0 {
		t.Errorf("gaining triggers deleted %d objects, first %s", len(d), d[0].Path)
	}
	if n := h.cached("owning all again", odd); n != len(odd) {
		t.Errorf("owning every trigger again, %d of the %d gained are cached", n, len(odd))
	}
}

// TestShardKeepsWhileDraining: while SetShard waits for a reconcile of a
// trigger it takes away, the caches keep that trigger (an event of it
// updates it, rather than removing it under the reconcile); once the
// reconcile has ended, they let it go.
//
// API server: watch events of a trigger being handed over.
func TestShardKeepsWhileDraining(t *testing.T) {
	h := newShareHarness(t, 12)
	c := h.c
	lost := h.odd[0]
	key := cache.ObjectName{Namespace: h.ns, Name: lost}
	d := TriggerDigest(key)
	if !c.begin(d, func() {}) { // a reconcile of it, under way
		t.Fatal("the engine does not own the trigger")
	}
	done := make(chan struct{})
	go func() {
		h.engine.SetShard(t.Context(), evenShard)
		close(done)
	}()
	h.eventually("the new shard in force", func() bool { return h.engine.currentShard() == evenShard })
	h.updateCM(lost, func(cm *corev1.ConfigMap) { cm.Data["k"] = "while draining" })
	h.eventually("the change of the trigger being reconciled cached", func() bool {
		obj, ok, _ := c.watches.trigger.Indexer().GetByKey(key.String())
		v, _, _ := unstructured.NestedString(objectOf(obj), "data", "k")
		return ok && v == "while draining"
	})
	if !c.complete() {
		t.Error("losing triggers made the caches incomplete")
	}
	select {
	case <-done:
		t.Fatal("SetShard returned while a reconcile of a trigger it took away was under way")
	default:
	}
	c.end(d)
	h.eventually("SetShard to return", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	h.eventually("the trigger let go of", func() bool { return h.cached("", []string{lost}) == 0 })
}

// objectOf is a cached object's content; nil for none.
func objectOf(obj any) map[string]any {
	if u := wholeOf(obj); u != nil {
		return u.Object
	}
	return nil
}

// TestShardPendingWaits: while the shard is a placeholder (a replica that
// has not joined), a rule whose informers filter lists nothing: it lists
// once, when the replica is given its share.
//
// API server: the lists informers make (counted by the request filter).
func TestShardPendingWaits(t *testing.T) {
	h := newHarness(t)
	h.shard = pendingShardFunc{noShard}
	h.createCM("early", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.startWith(h.loadRules(copyRule), false)
	h.eventually("the rule to wait for its share", func() bool {
		h.engine.set.mu.Lock()
		l := h.engine.set.loops["copy"]
		h.engine.set.mu.Unlock()
		if l == nil {
			return false
		}
		state, detail := l.getState()
		return state == StateSyncing && strings.Contains(detail, "share")
	})
	if n := len(h.counter.Requests(isList)); n != 0 {
		t.Errorf("a rule waiting for its share listed %d times", n)
	}
	h.engine.SetShard(t.Context(), allShard)
	h.eventually("the child of a trigger there before", func() bool { _, ok := h.configMap(h.ns, "early-copy"); return ok })
	h.eventually("the engine to be idle", h.loop("copy").idle)
	if n := len(h.counter.Requests(isList)); n != 2 {
		t.Errorf("given its share, the rule listed %d times, want 2 (its triggers and its children, once each)", n)
	}
	if n := h.loop("copy").refreshes.Load(); n != 0 {
		t.Errorf("given its first share, the rule listed again %d times, want 0", n)
	}
}
