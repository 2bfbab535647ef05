package rollout

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
)

// host is a Host over a store of triggers: it counts what the
// coordinator asks of the loop.
type host struct {
	triggers    cache.Store
	prunes      map[cache.ObjectName]int // children each trigger's move removes
	children    int
	panicPrunes bool
	// stepClusters are the clusters of each step by cluster.
	stepClusters [][]string

	// health judges a trigger from the caches (nil: healthy).
	health    func(context.Context, cache.ObjectName) Health
	mu        sync.Mutex
	requeued  []cache.ObjectName
	settled   int
	contained int
}

func newHost(t *testing.T, n int, created time.Time) *host {
	t.Helper()
	h := &host{triggers: cache.NewStore(cache.MetaNamespaceKeyFunc), prunes: map[cache.ObjectName]int{}, children: n}
	for i := range n {
		u := &unstructured.Unstructured{}
		u.SetNamespace("ns")
		u.SetName(fmt.Sprintf("t%02d", i))
		u.SetCreationTimestamp(metav1.NewTime(created))
		if err := h.triggers.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func (h *host) Triggers() cache.Store { return h.triggers }
func (h *host) Requeue(key cache.ObjectName) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requeued = append(h.requeued, key)
}
func (h *host) Coordinates() bool { return true }
func (h *host) Children() int     { return h.children }
func (h *host) Prunes(_ context.Context, keys []cache.ObjectName) int {
	if h.panicPrunes {
		panic("prunes")
	}
	n := 0
	for _, k := range keys {
		n += h.prunes[k]
	}
	return n
}
func (h *host) Health(ctx context.Context, key cache.ObjectName) Health {
	if h.health != nil {
		return h.health(ctx, key)
	}
	return Health{OK: true}
}
func (h *host) Contained(_ context.Context, v any) error {
	h.contained++
	return fmt.Errorf("panic: %v", v)
}
func (h *host) Settled() { h.settled++ }
func (h *host) StepClusters(_ rules.Rollout, i int) []string {
	if i < len(h.stepClusters) {
		return h.stepClusters[i]
	}
	return nil
}

func (h *host) takeRequeued() []cache.ObjectName {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.requeued
	h.requeued = nil
	return out
}

// journal is a Recorder that keeps the transitions.
type journal struct{ reasons []string }

func (j *journal) Record(_ context.Context, _ Record, _, reason, _ string) {
	j.reasons = append(j.reasons, reason)
}
func (j *journal) Fetch(context.Context) (*Record, error) { return nil, nil }

func newCoordinator(h *host, s rules.Rollout, started time.Time) (*Coordinator, *journal) {
	j := &journal{}
	r := &rules.Rule{Name: "roll", Content: rules.Content{Hash: "new0123456789"}, RunOptions: rules.RunOptions{Rollout: s}}
	from := &rules.Rule{Name: "roll", Content: rules.Content{Hash: "old0123456789"}}
	return New(r, Plan{From: from, Rec: Record{Started: started}}, false, h, j), j
}

func percent(v int) rules.Amount { return rules.Amount{Value: v, Percent: true} }

// TestStepsInDigestOrder: a rollout moves the triggers there when it
// began in steps of spec.rollout.step, lowest digests first, each once
// the step before is healthy, then completes; triggers created since are
// on the new revision from the start and moved by no step.
func TestStepsInDigestOrder(t *testing.T) {
	began := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h := newHost(t, 10, began.Add(-time.Hour))
	late := &unstructured.Unstructured{}
	late.SetNamespace("ns")
	late.SetName("late")
	late.SetCreationTimestamp(metav1.NewTime(began.Add(time.Minute)))
	_ = h.triggers.Add(late)
	c, j := newCoordinator(h, rules.Rollout{Step: percent(30), ProgressDeadline: time.Hour, MaxPrunes: percent(100)}, began)
	ctx := context.Background()

	if !c.OnNew(cache.ObjectName{Namespace: "ns", Name: "late"}) {
		t.Error("a trigger created since the rollout began is not on the new revision")
	}
	c.begin(ctx)
	var moved []cache.ObjectName
	for step := 1; step <= 4; step++ {
		batch := h.takeRequeued()
		if want := min(3, 10-len(moved)); len(batch) != want {
			t.Fatalf("step %d moved %d triggers, want %d", step, len(batch), want)
		}
		moved = append(moved, batch...)
		for _, k := range moved {
			if !c.OnNew(k) {
				t.Errorf("step %d: %s moved, yet not on the new revision", step, k)
			}
		}
		if rec := c.Record(); rec.Step != step || rec.Steps != 4 || rec.Moved != len(moved) || rec.Total != 10 {
			t.Fatalf("step %d: record %+v", step, rec)
		}
		c.check(ctx) // not healthy yet: no reconcile seen
		if got := h.takeRequeued(); len(got) != 0 {
			t.Fatalf("step %d moved on before its triggers were healthy: %v", step, got)
		}
		for _, k := range batch {
			c.Observe(k, Health{OK: true})
		}
		c.check(ctx)
	}
	digests := make([]uint64, len(moved))
	for i, k := range moved {
		digests[i] = Digest("roll", k)
	}
	if !slices.IsSortedFunc(moved, func(a, b cache.ObjectName) int {
		return cmp.Compare(Digest("roll", a), Digest("roll", b))
	}) {
		t.Errorf("triggers moved out of digest order: %v", digests)
	}
	if rec := c.Record(); rec.State != Complete || !c.Settled() || h.settled != 1 {
		t.Errorf("after the last step: %+v, settled %v (told %d times)", rec, c.Settled(), h.settled)
	}
	want := []string{"RolloutStep", "RolloutStep", "RolloutStep", "RolloutStep", "RolloutComplete"}
	if !slices.Equal(j.reasons, want) {
		t.Errorf("recorded %v, want %v", j.reasons, want)
	}
}

// TestPruneBudgetHalts: a step that would remove more children than
// maxPrunes allows halts the rollout before it moves anything, saying how
// much the change removes in all; raising maxPrunes goes on.
func TestPruneBudgetHalts(t *testing.T) {
	began := time.Now().Add(-time.Minute).Truncate(time.Second)
	h := newHost(t, 10, began.Add(-time.Hour))
	for _, k := range h.triggers.ListKeys() {
		key, _ := cache.ParseObjectName(k)
		h.prunes[key] = 1
	}
	s := rules.Rollout{Step: percent(30), ProgressDeadline: time.Hour, MaxPrunes: percent(10)}
	c, j := newCoordinator(h, s, began)
	ctx := context.Background()
	c.begin(ctx)
	rec := c.Record()
	if rec.State != Halted || rec.Reason != ReasonPruneBudget || rec.Step != 0 {
		t.Fatalf("record %+v, want halted for the prune budget before step 1", rec)
	}
	if got := h.takeRequeued(); len(got) != 0 {
		t.Errorf("a halted rollout moved %v", got)
	}
	if want := "removes 10 of the rule's 10 children in all"; !strings.Contains(rec.Message, want) {
		t.Errorf("message %q does not say %q", rec.Message, want)
	}
	s.MaxPrunes = percent(100)
	c.SetSettings(ctx, s)
	if rec := c.Record(); rec.State != Progressing {
		t.Fatalf("after raising maxPrunes: %+v", rec)
	}
	c.check(ctx) // step 0: nothing under way yet
	c.next(ctx)
	if got := h.takeRequeued(); len(got) != 3 {
		t.Errorf("after raising maxPrunes, step 1 moved %d triggers, want 3", len(got))
	}
	if want := []string{"RolloutHalted", "RolloutResumed", "RolloutStep"}; !slices.Equal(j.reasons, want) {
		t.Errorf("recorded %v, want %v", j.reasons, want)
	}
}

// TestFailedStepRollsBack: a step whose triggers are not healthy by its
// deadline, more of them than maxFailures, rolls back under onFailure:
// Rollback — every trigger it moved is queued for the old revision.
func TestFailedStepRollsBack(t *testing.T) {
	began := time.Now().Add(-time.Minute).Truncate(time.Second)
	h := newHost(t, 4, began.Add(-time.Hour))
	s := rules.Rollout{Step: percent(50), ProgressDeadline: time.Nanosecond, MaxPrunes: percent(100), OnFailure: rules.RolloutRollback}
	c, _ := newCoordinator(h, s, began)
	ctx := context.Background()
	c.begin(ctx)
	batch := h.takeRequeued()
	c.Observe(batch[0], Health{OK: true})
	c.Observe(batch[1], Health{Why: "child not ready"})
	time.Sleep(time.Millisecond) // past the deadline of one nanosecond
	c.check(ctx)
	rec := c.Record()
	if rec.State != RolledBack || !strings.Contains(rec.Message, "child not ready") {
		t.Fatalf("record %+v, want rolled back saying why", rec)
	}
	back := h.takeRequeued()
	slices.SortFunc(back, func(a, b cache.ObjectName) int { return strings.Compare(a.String(), b.String()) })
	slices.SortFunc(batch, func(a, b cache.ObjectName) int { return strings.Compare(a.String(), b.String()) })
	if !slices.Equal(back, batch) {
		t.Errorf("queued back %v, want the step's %v", back, batch)
	}
	for _, k := range batch {
		if c.OnNew(k) {
			t.Errorf("%s still on the new revision after the rollback", k)
		}
	}
}

// TestPanicHalts: a panic in a step of the coordinator is contained and
// halts the rollout, reason Panic.
func TestPanicHalts(t *testing.T) {
	began := time.Now().Truncate(time.Second)
	h := newHost(t, 4, began.Add(-time.Hour))
	h.panicPrunes = true
	c, _ := newCoordinator(h, rules.Rollout{Step: percent(50), ProgressDeadline: time.Hour, MaxPrunes: percent(100)}, began)
	c.guard(context.Background(), c.begin)
	if rec := c.Record(); rec.State != Halted || rec.Reason != ReasonPanic || h.contained != 1 {
		t.Errorf("record %+v, contained %d: want halted for the panic", rec, h.contained)
	}
}
