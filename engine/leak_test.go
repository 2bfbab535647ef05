//go:build robustness

// The leak tests measure the heap, which no other test may share: they
// run alone, in `make robustness`, not in the default suite.

package engine

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// backToBaseline reports whether the heap got is at most 5% or slack bytes,
// whichever is more, above base. A smaller heap is no leak: the GC frees
// what warm-up left behind.
func backToBaseline(got, base, slack uint64) bool { return got <= base+max(base/20, slack) }

// churnSlack is the heap growth per trigger cycle the churn test puts down
// to noise (buffers of the watch streams, sizes of maps that never shrink):
// less than what keeping anything of a deleted trigger costs, a map entry
// keyed by its name.
const churnSlack = 32

// TestTriggerChurnDoesNotLeak: 10,000 triggers created and deleted — each
// getting its child and an Applied Event (--events=all), each child pruned —
// leave the heap, goroutines and informers where they were. The baseline is
// taken after 5,000 warm-up cycles, once the recorder's bounded Event caches
// (one entry per Event that reached its correlator) are full. They hold 256
// entries here rather than client-go's 4,096: the recorder drops Events when
// its queue is full, which under the race detector is most of them, and
// filling 4,096 entries would take some 25,000 cycles.
//
// API server: watch events and Events at volume.
func TestTriggerChurnDoesNotLeak(t *testing.T) {
	const batch, warmup, cycles = 500, 5000, 10_000
	h := newHarness(t)
	h.eventMode = EventsAll
	h.eventLRU = eventCaches
	h.start(h.loadRules(copyRule))
	cms := h.cs.CoreV1().ConfigMaps(h.ns)
	c := h.loop("copy")
	round := 0
	churn := func(n int) {
		for ; n > 0; n -= batch {
			round++
			h.counter.Reset() // the test's request log is not the engine's memory
			names := make([]string, batch)
			for i := range names {
				names[i] = fmt.Sprintf("c%d-%d", round, i)
			}
			parallel(t, names, func(ctx context.Context, name string) error {
				_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"copy": "yes"}}}, metav1.CreateOptions{})
				return err
			})
			if !h.within(2*time.Minute, func() bool { return len(c.cachedChildren(h.ns)) == batch }) {
				t.Fatalf("round %d: %d children in the cache, want %d; queue %d, in flight %d", round, len(c.cachedChildren(h.ns)), batch, c.queue.Len(), c.inFlight.Load())
			}
			parallel(t, names, func(ctx context.Context, name string) error {
				return cms.Delete(ctx, name, metav1.DeleteOptions{})
			})
			if !h.within(2*time.Minute, func() bool { return len(c.cachedChildren(h.ns)) == 0 && c.idle() }) {
				t.Fatalf("round %d: %d children still in the cache; queue %d, in flight %d", round, len(c.cachedChildren(h.ns)), c.queue.Len(), c.inFlight.Load())
			}
		}
	}
	churn(warmup)
	for n := h.eventCount(); n < eventCaches+batch; n = h.eventCount() {
		t.Logf("%d Events after the warm-up, too few to fill the Event caches: one more round", n)
		churn(batch)
	}
	heap, goroutines, informers := heapAfterGC(), runtime.NumGoroutine(), h.engine.Informers()
	churn(cycles)
	h.eventually("goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= goroutines })
	if n := h.engine.Informers(); n != informers {
		t.Errorf("%d informers after the churn, %d before", n, informers)
	}
	var after uint64
	if !h.within(30*time.Second, func() bool {
		after = heapAfterGC()
		return backToBaseline(after, heap, churnSlack*cycles)
	}) {
		t.Fatalf("heap %d → %d bytes (%+.1f%%) over %d cycles, more than 5%% or %d bytes a cycle above the baseline", heap, after, 100*(float64(after)/float64(heap)-1), cycles, churnSlack)
	}
	t.Logf("heap %d → %d bytes (%+.1f%%) over %d cycles; goroutines %d; informers %d",
		heap, after, 100*(float64(after)/float64(heap)-1), cycles, runtime.NumGoroutine(), informers)
	if applied, deleted, inflight, _ := c.rc.writes.remembered(); applied+deleted+inflight != 0 {
		t.Errorf("the loop still remembers %d applied, %d deleted and %d in-flight children", applied, deleted, inflight)
	}
}

// eventCaches is the size of each of the recorder's Event caches (the
// correlator's aggregator, spam filter and logger) in the leak test.
const eventCaches = 256

// events counts the Events in the test's namespace.
func (h *harness) eventCount() int {
	h.t.Helper()
	l, err := h.cs.CoreV1().Events(h.ns).List(h.t.Context(), metav1.ListOptions{Limit: 1})
	if err != nil {
		h.t.Fatal(err)
	}
	n := len(l.Items)
	if l.RemainingItemCount != nil {
		n += int(*l.RemainingItemCount)
	}
	return n
}

// TestReloadCyclesDoNotLeak: 200 cycles of adding and removing a rule bring
// informers, goroutines and the heap (+5% at most) back to where they were
// after 20 warm-up cycles.
//
// API server: informers started and stopped against live watches.
func TestReloadCyclesDoNotLeak(t *testing.T) {
	h := newHarness(t)
	base := h.loadRules(labelRule("base", "base", "x"))
	both := h.loadRules(labelRule("base", "base", "x") + "---\n" + labelRule("extra", "extra", "y"))
	h.start(base)
	informers := h.engine.Informers()
	cycle := func(n int) {
		for range n {
			h.engine.Enforce(t.Context(), both)
			h.eventually("the added rule running", func() bool { return h.engine.Ready() })
			// The extra rule's own trigger and child informers.
			if n := h.engine.Informers(); n != informers+2 {
				t.Fatalf("with the extra rule running: %d informers, want %d", n, informers+2)
			}
			h.engine.Enforce(t.Context(), base)
		}
		h.counter.Reset() // the test's request log is not the engine's memory
	}
	cycle(20)
	goroutines := runtime.NumGoroutine()
	h.eventually("goroutines to settle", func() bool {
		n := runtime.NumGoroutine()
		defer func() { goroutines = n }()
		return n == goroutines
	})
	heap := heapAfterGC()
	cycle(200)
	if n := h.engine.Informers(); n != informers {
		t.Errorf("after 200 reload cycles: %d informers, want %d", n, informers)
	}
	h.eventually(fmt.Sprintf("goroutines back to %d", goroutines), func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
	var after uint64
	h.eventually("the heap back to the baseline (+5% at most)", func() bool {
		after = heapAfterGC()
		return backToBaseline(after, heap, 0)
	})
	t.Logf("heap %d → %d bytes (%+.1f%%) over 200 rule cycles", heap, after, 100*(float64(after)/float64(heap)-1))
}
