package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

// boomRule makes a child of every ConfigMap labelled boom=yes; the test's
// Metrics panics on its writes, as code that panics in the middle of a
// reconcile would.
const boomRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: boom}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "boom=yes"}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-boom"}
        data: {from: "${object.metadata.name}"}
  resyncPeriod: "0"
  rateLimit: {baseDelay: 20ms, maxDelay: 10s}
`

// TestPanicsContained: a panic in a trigger's reconcile — in its apply,
// then in its prune — fails that trigger alone: a Failed Event quoting
// the panic, syncloop_panics_total{where="reconcile"}, retries with
// exponential backoff (no hot loop); the engine goes on, and another
// rule's triggers, created after the panics, are reconciled. A panic in an
// informer's event handler is contained there: counted, the informer and
// the rule's other handlers go on; so is one in a step of the rule's loop.
//
// API server: the garbage collector racing a prune, held off by a
// finalizer; Events.
func TestPanicsContained(t *testing.T) {
	h := newHarness(t)
	var mode atomic.Value // the action of rule boom whose Write panics
	mode.Store(ActionCreate)
	var mu sync.Mutex
	var panicked []time.Time
	m := &recordingMetrics{panicOn: func(rule, action string) bool {
		want := mode.Load().(string)
		if rule != "boom" || (action != want && !(want == ActionCreate && action == "unchanged")) {
			return false
		}
		mu.Lock()
		panicked = append(panicked, time.Now())
		mu.Unlock()
		return true
	}}
	h.metrics = m
	h.start(h.loadRules(boomRule + "---\n" + copyRule))

	// The apply: the child is made, then the reconcile panics; every retry
	// finds it unchanged and panics again, with backoff.
	h.createCM("t1", map[string]string{"boom": "yes"}, nil)
	h.waitForFailed("t1", "panic: injected into boom's create")
	h.checkBackoffOf("panicking reconciles", 20*time.Millisecond, 6, func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), panicked...)
	})
	// The panic is recorded above when it is thrown, and counted once the
	// reconcile has recovered it: the count may trail by one.
	if !h.within(10*time.Second, func() bool { return m.panicked("boom", PanicReconcile) >= 6 }) {
		t.Errorf("syncloop_panics_total{rule=boom,where=reconcile} = %d, want every panic counted", m.panicked("boom", PanicReconcile))
	}
	h.createCM("c1", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.eventually("the other rule's child, made after the panics", func() bool { _, ok := h.configMap(h.ns, "c1-copy"); return ok })

	// The prune: the child is deleted, then the reconcile panics. The
	// child is held by a finalizer meanwhile: the garbage collector,
	// following its ownerReference, may delete it first, and the prune's
	// delete of an object being deleted is still made (a gone one's is
	// not, and would not panic).
	h.holdChild("t1-boom")
	mode.Store(ActionDelete)
	before := m.panicked("boom", PanicReconcile)
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "t1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("a panic in the prune, contained", func() bool { return m.panicked("boom", PanicReconcile) > before })
	h.letGoChild("t1-boom")
	h.eventually("the child pruned", func() bool { _, ok := h.configMap(h.ns, "t1-boom"); return !ok })

	// An event handler: subscribed to the copy rule's trigger informer, it
	// is sent an Add for every cached trigger, and panics on each.
	l := h.loop("copy")
	sub, err := l.watches.actor.registry.Subscribe(t.Context(), l.watches.triggerKey(), containedHandler{
		l: l, logger: klog.Background(), queued: l.enqueue,
		h: cache.ResourceEventHandlerFuncs{AddFunc: func(any) { panic("injected into a handler") }},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Stop()
	h.eventually("the handler's panic, counted", func() bool { return m.panicked("copy", PanicHandler) > 0 })
	h.createCM("c2", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.eventually("a child made after the handler panicked", func() bool { _, ok := h.configMap(h.ns, "c2-copy"); return ok })
	if n := m.panicked("copy", PanicHandler); n < 2 {
		t.Errorf("syncloop_panics_total{rule=copy,where=handler} = %d, want a panic for each of the two triggers", n)
	}
	// A step of the loop (a sweep, a resync, a shard change): it fails,
	// the loop goes on.
	l.step(t.Context(), func(context.Context) { panic("injected into a step of the loop") })
	if n := m.panicked("copy", PanicLoop); n != 1 {
		t.Errorf("syncloop_panics_total{rule=copy,where=loop} = %d, want 1", n)
	}
	h.createCM("c3", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.eventually("a child made after the loop's step panicked", func() bool { _, ok := h.configMap(h.ns, "c3-copy"); return ok })
	for _, s := range h.engine.States() {
		if s.State != StateRunning {
			t.Errorf("rule %s is %s (%s), want running", s.Rule, s.State, s.Detail)
		}
	}
}

// panickyRollouts is a memRollouts whose Record panics for one reason.
type panickyRollouts struct {
	*memRollouts
	on string
}

func (p panickyRollouts) Record(ctx context.Context, r *rules.Rule, rec rollout.Record, eventType, reason, msg string) {
	if reason == p.on {
		panic("injected into recording " + reason)
	}
	p.memRollouts.Record(ctx, r, rec, eventType, reason, msg)
}

// TestRolloutPanicHalts: a panic in the rollout coordinator halts the
// rollout, saying why (reason Panic); the rule goes on reconciling its
// triggers at the revision they are on.
//
// API server: watches and applies of two revisions on live children.
func TestRolloutPanicHalts(t *testing.T) {
	h := newHarness(t)
	m := &recordingMetrics{}
	h.metrics = m
	v1 := h.loadRules(rolloutRule("v1", false, "", ""))
	store := newMemRollouts(v1.Get("roll"))
	h.rollouts = panickyRollouts{memRollouts: store, on: "RolloutStep"}
	h.createTriggers(20)
	h.start(v1)
	h.eventually("20 children at v1", func() bool { c, _ := h.childVersions("v1"); return c["v1"] == 20 })

	h.updates <- h.loadRules(rolloutRule("v2", false, "step: 5", ""))
	h.eventually("the rollout halted by the panic", func() bool {
		rec := store.get("roll")
		return rec.State == rollout.Halted && rec.Reason == rollout.ReasonPanic
	})
	if msg := store.get("roll").Message; !strings.Contains(msg, "panic: injected into recording RolloutStep") {
		t.Errorf("the halt says %q, want the panic", msg)
	}
	if n := m.panicked("roll", PanicRollout); n != 1 {
		t.Errorf("syncloop_panics_total{rule=roll,where=rollout} = %d, want 1", n)
	}
	// The rule still repairs drift on a trigger the rollout did not move.
	_, at := h.childVersions("v1")
	if len(at) == 0 {
		t.Fatal("no child left at v1")
	}
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), at[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(fmt.Sprintf("%s repaired", at[0]), func() bool { _, ok := h.configMap(h.ns, at[0]); return ok })
}
