package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/internal/testenv"
)

// shardFunc is a Shard from a function.
type shardFunc func(rule string, d uint64) bool

func (f shardFunc) Owns(rule string, d uint64) bool { return f(rule, d) }

var (
	evenShard = shardFunc(func(_ string, d uint64) bool { return d%2 == 0 })
	allShard  = shardFunc(func(string, uint64) bool { return true })
	noShard   = shardFunc(func(string, uint64) bool { return false })
)

// TestPatchManagerName: the field manager of a trigger's patches is named
// from its key's digest as it was before sharding (objects in clusters
// carry it), and names the digest back.
func TestPatchManagerName(t *testing.T) {
	key := cache.ObjectName{Namespace: "shop", Name: "web"}
	sum := sha256.Sum256([]byte("shop/web"))
	want := patchManagerPrefix("r") + hex.EncodeToString(sum[:8])
	if got := patchManager("r", key); got != want {
		t.Errorf("patchManager = %q, want %q", got, want)
	}
	if d, ok := managerDigest(want, patchManagerPrefix("r")); !ok || d != TriggerDigest(key) {
		t.Errorf("managerDigest(%q) = %x, %v; want %x", want, d, ok, TriggerDigest(key))
	}
}

// TestShard: an engine reconciles, prunes and sweeps only the triggers its
// shard owns; SetShard queues those it gains, and the children of a
// trigger deleted while another replica owned it are pruned by the sweep of
// the replica that gains it.
func TestShard(t *testing.T) {
	h := newHarness(t)
	h.shard = evenShard
	h.start(h.loadRules(copyRule))
	var even, odd []string
	for i := range 24 {
		name := fmt.Sprintf("t%d", i)
		h.createCM(name, map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
		if TriggerDigest(cache.ObjectName{Namespace: h.ns, Name: name})%2 == 0 {
			even = append(even, name)
		} else {
			odd = append(odd, name)
		}
	}
	if len(even) == 0 || len(odd) == 0 {
		t.Fatalf("24 names all fell on one side: even %v, odd %v", even, odd)
	}
	has := func(names []string) func() bool {
		return func() bool {
			for _, n := range names {
				if _, ok := h.configMap(h.ns, n+"-copy"); !ok {
					return false
				}
			}
			return true
		}
	}
	h.eventually("the owned triggers' children", has(even))
	c := h.controller("copy")
	h.eventually("the engine to be idle", c.idle)
	for _, n := range odd {
		if _, ok := h.configMap(h.ns, n+"-copy"); ok {
			t.Errorf("%s-copy was made by an engine whose shard does not own %s", n, n)
		}
	}
	if got := h.engine.Owned()["copy"]; got != len(even) {
		t.Errorf("Owned()[copy] = %d, want %d", got, len(even))
	}

	// Gaining the rest queues them, and writes nothing for what it had.
	h.counter.Reset()
	h.engine.SetShard(t.Context(), allShard)
	h.eventually("the gained triggers' children", has(odd))
	h.eventually("the engine to be idle", c.idle)
	for _, r := range h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }) {
		for _, n := range even {
			if strings.HasSuffix(r.Path, "/"+n+"-copy") {
				t.Errorf("after gaining triggers, the engine wrote a child it had already made: %s %s", r.Method, r.Path)
			}
		}
	}

	// Owning nothing: the children of a trigger that stops matching stay,
	// for its owner. (Not a deleted trigger: the garbage collector would
	// delete the children through their ownerReferences.)
	h.engine.SetShard(t.Context(), noShard)
	gone := odd[0]
	h.updateCM(gone, func(cm *corev1.ConfigMap) { cm.Labels["copy"] = "no" })
	h.eventually("the engine to be idle", c.idle)
	if h.within(time.Second, func() bool { _, ok := h.configMap(h.ns, gone+"-copy"); return !ok }) {
		t.Fatalf("an engine that owns no trigger pruned %s-copy", gone)
	}
	// Gaining it back: the sweep finds the orphan and prunes it.
	h.engine.SetShard(t.Context(), allShard)
	h.eventually(gone+"-copy pruned by the replica that gained its trigger", func() bool {
		_, ok := h.configMap(h.ns, gone+"-copy")
		return !ok
	})
}

// TestSetShardDrains: SetShard does not return while a reconcile of a
// trigger it takes away is under way.
func TestSetShardDrains(t *testing.T) {
	h := newHarness(t)
	release := make(chan struct{})
	held := make(chan struct{})
	var once sync.Once
	cfg := h.env.Config()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/slow-copy") {
				once.Do(func() { close(held) })
				<-release
			}
			return rt.RoundTrip(req)
		})
	})
	h.config = cfg
	h.shard = allShard
	h.start(h.loadRules(copyRule))
	h.createCM("slow", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the reconcile of slow never applied its child")
	}
	returned := make(chan struct{})
	go func() {
		h.engine.SetShard(t.Context(), noShard)
		close(returned)
	}()
	select {
	case <-returned:
		t.Fatal("SetShard returned while a reconcile of a trigger it took away was writing")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("SetShard did not return once the reconcile finished")
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSettleDelay: a trigger this replica has just gained waits out the
// settling period before its first reconcile here; one it has owned longer
// does not; one lost and gained back waits again.
func TestSettleDelay(t *testing.T) {
	e := New(Options{Shard: noShard})
	old := time.Now().Add(-2 * handoverSettle)
	e.shards = []shardChange{{s: evenShard, at: old}} // even keys owned for long
	e.SetShard(t.Context(), allShard)                 // odd keys gained now
	var even, odd uint64 = 2, 3
	if d := e.settleDelay("r", even); d > 0 {
		t.Errorf("a trigger owned for %s waits %s", 2*handoverSettle, d)
	}
	if d := e.settleDelay("r", odd); d <= 0 || d > handoverSettle {
		t.Errorf("a trigger just gained waits %s, want (0, %s]", d, handoverSettle)
	}
	e.SetShard(t.Context(), noShard)
	e.SetShard(t.Context(), allShard)
	if d := e.settleDelay("r", even); d <= 0 {
		t.Errorf("a trigger lost and gained back waits %s", d)
	}
}

// heldShard owns everything, and is held while held is true.
type heldShard struct{ held *atomic.Bool }

func (heldShard) Owns(string, uint64) bool { return true }
func (h heldShard) Held() bool             { return h.held.Load() }

// TestShardNotHeld: while the shard is not held, no trigger is reconciled
// and none is dropped: once it is held again, each is.
func TestShardNotHeld(t *testing.T) {
	h := newHarness(t)
	held := &atomic.Bool{}
	h.shard = heldShard{held}
	h.start(h.loadRules(copyRule))
	h.createCM("waiting", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	if h.within(2*time.Second, func() bool { _, ok := h.configMap(h.ns, "waiting-copy"); return ok }) {
		t.Fatal("a trigger was reconciled while the shard was not held")
	}
	held.Store(true)
	h.eventually("the trigger reconciled once the shard is held", func() bool {
		_, ok := h.configMap(h.ns, "waiting-copy")
		return ok
	})
}
