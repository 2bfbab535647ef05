package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// shardFunc is a Shard from a function: held, no placeholder, keeping
// what it owns, and unable to tell what it keeps within.
type shardFunc func(rule string, d uint64) bool

func (f shardFunc) Owns(rule string, d uint64) bool  { return f(rule, d) }
func (f shardFunc) Keeps(rule string, d uint64) bool { return f(rule, d) }
func (shardFunc) KeepsWithin(Shard) bool             { return false }
func (shardFunc) Held() bool                         { return true }
func (shardFunc) Pending() bool                      { return false }

// modShard owns the triggers whose digest is rem modulo mod; it keeps
// within one whose classes hold all of its own.
type modShard struct{ mod, rem uint64 }

func (s modShard) Owns(_ string, d uint64) bool  { return d%s.mod == s.rem }
func (s modShard) Keeps(_ string, d uint64) bool { return d%s.mod == s.rem }
func (modShard) Held() bool                      { return true }
func (modShard) Pending() bool                   { return false }

func (s modShard) KeepsWithin(then Shard) bool {
	t, ok := then.(modShard)
	if f, future := then.(futureShard); future {
		t, ok = f.modShard, true
	}
	return ok && s.mod%t.mod == 0 && s.rem%t.mod == t.rem
}

// futureShard keeps what its modShard owns, and owns nothing yet: a
// replica's share while a handover to it is under way.
type futureShard struct{ modShard }

func (futureShard) Owns(string, uint64) bool { return false }

func (f futureShard) Keeps(_ string, d uint64) bool { return f.modShard.Owns("", d) }

var (
	evenShard = modShard{2, 0}
	allShard  = modShard{1, 0}
	noShard   = shardFunc(func(string, uint64) bool { return false })
)

// TestPatchManagerName: the field manager of a trigger's patches is named
// from its key's digest as it was before sharding (objects in clusters
// carry it), and names the digest back.
func TestPatchManagerName(t *testing.T) {
	key := cache.ObjectName{Namespace: "shop", Name: "web"}
	sum := sha256.Sum256([]byte("shop/web"))
	r := &rules.Rule{Name: "r"}
	want := "syncloop/r/" + hex.EncodeToString(sum[:8])
	if got := patchManager(r, key); got != want {
		t.Errorf("patchManager = %q, want %q", got, want)
	}
	if d, ok := managerDigest(want, patchManagerPrefix(r)); !ok || d != TriggerDigest(key) {
		t.Errorf("managerDigest(%q) = %x, %v; want %x", want, d, ok, TriggerDigest(key))
	}
	// A named installation's patches have managers of their own.
	r = &rules.Rule{Name: "r", Installation: "team-a"}
	if got := patchManager(r, key); got != "syncloop@team-a/r/"+hex.EncodeToString(sum[:8]) || !rules.IsPatchManager(got) {
		t.Errorf("patchManager of installation team-a = %q", got)
	}
	for _, m := range []string{"syncloop/r", "syncloop@team-a/r", "kubectl", "syncloop@team-a"} {
		if rules.IsPatchManager(m) {
			t.Errorf("IsPatchManager(%q) = true", m)
		}
	}
}

// TestShard: an engine reconciles, prunes and sweeps only the triggers its
// shard owns; SetShard queues those it gains, and the children of a
// trigger deleted while another replica owned it are pruned by the sweep of
// the replica that gains it.
//
// API server: watches and deletes of the triggers a shard owns.
func TestShard(t *testing.T) {
	h := newHarness(t)
	h.shard = evenShard
	h.start(h.loadRules(copyRule))
	even, odd := h.evenAndOdd(24)
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
	c := h.loop("copy")
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

// evenAndOdd creates n triggers of copyRule and names them by the side of
// evenShard they fall on.
func (h *harness) evenAndOdd(n int) (even, odd []string) {
	h.t.Helper()
	for i := range n {
		name := fmt.Sprintf("t%d", i)
		h.createCM(name, map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
		if evenShard.Owns("copy", TriggerDigest(cache.ObjectName{Namespace: h.ns, Name: name})) {
			even = append(even, name)
		} else {
			odd = append(odd, name)
		}
	}
	if len(even) == 0 || len(odd) == 0 {
		h.t.Fatalf("%d names all fell on one side: even %v, odd %v", n, even, odd)
	}
	return even, odd
}

// TestSetShardDrains: SetShard does not return while a reconcile of a
// trigger it takes away is under way.
//
// API server: a reconcile held in flight by a slow request.
func TestSetShardDrains(t *testing.T) {
	h := newHarness(t)
	held, release := h.holdApplies("slow-copy")
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
	release()
	select {
	case <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("SetShard did not return once the reconcile finished")
	}
}

// holdApplies makes the engine's applies of the child named name wait,
// from the first, until release is called; held is closed once the first
// has begun. A test that may fail while one is held defers release: its
// deferred calls run before the harness stops the engine, which would wait.
func (h *harness) holdApplies(name string) (held <-chan struct{}, release func()) {
	h.t.Helper()
	hold, let := make(chan struct{}), make(chan struct{})
	var first, once sync.Once
	release = func() { once.Do(func() { close(let) }) }
	cfg := h.env.Config()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPatch && strings.HasSuffix(req.URL.Path, "/"+name) {
				first.Do(func() { close(hold) })
				<-let
			}
			return rt.RoundTrip(req)
		})
	})
	h.config = cfg
	return hold, release
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestOwnedSince: a trigger gained just now is owned since now; one owned
// since before the shards remembered, since always (zero); one lost and
// gained back, since it came back.
func TestOwnedSince(t *testing.T) {
	e := New(Options{Shard: noShard})
	old := time.Now().Add(-2 * handoverVerify)
	e.share.history = []shardChange{{s: evenShard, at: old}} // even keys owned for long
	e.SetShard(t.Context(), allShard)                        // odd keys gained now
	var even, odd uint64 = 2, 3
	if since := e.ownedSince("r", even); !since.IsZero() {
		t.Errorf("a trigger owned for %s: since %s, want zero", 2*handoverVerify, since)
	}
	if since := e.ownedSince("r", odd); time.Since(since) > time.Second {
		t.Errorf("a trigger just gained: since %s", since)
	}
	e.SetShard(t.Context(), noShard)
	e.SetShard(t.Context(), allShard)
	if since := e.ownedSince("r", even); time.Since(since) > time.Second {
		t.Errorf("a trigger lost and gained back: since %s", since)
	}
}

// TestHandoverVerifies: a replica that gains a trigger whose child the
// previous owner made, but whose own child cache has not seen it yet,
// reads the child from the API server and writes nothing. (Its caches
// kept the trigger's objects before it owned the trigger, as sharding's
// handovers have them: a gain its caches did not keep lists them again.)
//
// API server: a GET of a child the cache has not seen yet.
func TestHandoverVerifies(t *testing.T) {
	first := newHarness(t)
	first.shard = allShard
	// Once holding, the second replica's child watch delivers nothing
	// until released.
	second := &harness{t: t, env: first.env, cs: first.cs, ns: first.ns, counter: &testenv.RequestCounter{}, updates: make(chan *rules.Set), shard: futureShard{allShard}, shared: first.shared}
	holding := &atomic.Bool{}
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	cfg := first.env.Config()
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			q := req.URL.Query()
			if err == nil && q.Get("watch") == "true" && strings.Contains(q.Get("labelSelector"), "managed-by") {
				resp.Body = &heldBody{ReadCloser: resp.Body, holding: holding, release: release}
			}
			return resp, err
		})
	})
	second.config = cfg
	set := first.loadRules(copyRule)
	first.start(set)
	second.start(set)
	holding.Store(true)
	first.createCM("t", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	first.eventually("the first replica's child", func() bool { _, ok := first.configMap(first.ns, "t-copy"); return ok })
	first.eventually("the first replica to be idle", first.loop("copy").idle)

	first.engine.SetShard(t.Context(), noShard)
	second.counter.Reset()
	second.engine.SetShard(t.Context(), allShard)
	c := second.loop("copy")
	second.eventually("the second replica to reconcile the trigger it gained", func() bool { return c.reconciles.Load() > 0 && c.idle() })
	var gets int
	for _, r := range second.counter.Requests(func(r testenv.Request) bool { return strings.HasSuffix(r.Path, "/t-copy") }) {
		if r.IsWrite() {
			t.Errorf("the replica that gained the trigger wrote its child again: %s %s", r.Method, r.Path)
		}
		if r.Method == http.MethodGet {
			gets++
		}
	}
	if gets != 1 {
		t.Errorf("the replica read the child it had not seen %d times, want 1", gets)
	}
}

// heldBody is a response body whose reads, while holding, wait until
// release is closed.
type heldBody struct {
	io.ReadCloser
	holding *atomic.Bool
	release <-chan struct{}
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.holding.Load() {
		<-b.release
	}
	return n, err
}

// heldShard owns everything, and is held while held is true.
type heldShard struct {
	shardFunc
	held *atomic.Bool
}

func (h heldShard) Held() bool { return h.held.Load() }

// TestShardNotHeld: while the shard is not held, no trigger is reconciled
// and none is dropped: once it is held again, each is.
//
// API server: watch events queued while the shard is not held.
func TestShardNotHeld(t *testing.T) {
	h := newHarness(t)
	held := &atomic.Bool{}
	h.shard = heldShard{shardFunc(func(string, uint64) bool { return true }), held}
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
