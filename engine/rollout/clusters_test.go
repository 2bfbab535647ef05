package rollout

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// clusterSteps are n compiled steps by cluster (their selectors are not
// evaluated here: the host says which clusters each reaches).
func clusterSteps(t *testing.T, n int) []*rules.Expression {
	t.Helper()
	c, err := expr.NewCompiler(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*rules.Expression
	for range n {
		p, err := c.Compile("cluster.name == 'x'", expr.Scope{Cluster: true, ClusterOnly: true}, expr.BoolResult)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &rules.Expression{Program: p})
	}
	return out
}

// TestStepsByCluster: a rollout by cluster moves every trigger at its
// first step, then takes one step per cluster step and one for the rest,
// each once every trigger reconciled since it began is healthy — a
// reconcile before the step began does not count — and completes; a step
// whose triggers stay unhealthy past the deadline halts the rollout
// where it is.
func TestStepsByCluster(t *testing.T) {
	began := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h := newHost(t, 4, began.Add(-time.Hour))
	h.stepClusters = [][]string{{"canary"}, {"eu-1", "eu-2"}, {"us"}}
	s := rules.Rollout{Strategy: rules.RolloutProgressive, Step: percent(10), ProgressDeadline: time.Hour,
		MaxPrunes: percent(100), Clusters: clusterSteps(t, 2)}
	c, j := newCoordinator(h, s, began)
	ctx := context.Background()
	all := func() []cache.ObjectName {
		var out []cache.ObjectName
		ks := h.triggers.ListKeys()
		slices.Sort(ks)
		for _, k := range ks {
			ns, name, _ := strings.Cut(k, "/")
			out = append(out, cache.ObjectName{Namespace: ns, Name: name})
		}
		return out
	}

	c.begin(ctx)
	for step := 1; step <= 3; step++ {
		rec := c.Record()
		if rec.Step != step || rec.Steps != 3 || rec.Moved != 4 || rec.Threshold != math.MaxUint64 || rec.State != Progressing {
			t.Fatalf("step %d: record %+v", step, rec)
		}
		for _, k := range all() {
			if !c.OnNew(k) {
				t.Fatalf("step %d: %s not on the new revision", step, k)
			}
		}
		if got := h.takeRequeued(); len(got) != 4 {
			t.Fatalf("step %d requeued %d triggers, want all 4", step, len(got))
		}
		c.check(ctx)
		if c.Record().Step != step {
			t.Fatalf("step %d moved on before any trigger was reconciled in it", step)
		}
		for i, k := range all() {
			if i < 3 {
				c.Observe(k, Health{OK: true})
			}
		}
		c.check(ctx)
		if c.Record().Step != step {
			t.Fatalf("step %d moved on with a trigger not reconciled in it", step)
		}
		c.Observe(all()[3], Health{OK: true})
		c.check(ctx)
	}
	if rec := c.Record(); rec.State != Complete || rec.Step != 3 {
		t.Fatalf("after three healthy steps: %+v", rec)
	}
	if want := []string{"RolloutStep", "RolloutStep", "RolloutStep", "RolloutComplete"}; !slices.Equal(j.reasons, want) {
		t.Errorf("transitions %v, want %v", j.reasons, want)
	}

	// A step that stays unhealthy past its deadline halts: the next
	// step's clusters are not reached.
	s.ProgressDeadline = time.Second
	c, j = newCoordinator(h, s, began)
	c.begin(ctx)
	h.takeRequeued()
	c.Observe(all()[0], Health{Why: "canary's deployment is not available"})
	c.mu.Lock()
	c.rec.StepStarted = time.Now().Add(-time.Minute)
	c.mu.Unlock()
	c.check(ctx)
	if rec := c.Record(); rec.State != Halted || rec.Step != 1 || !strings.Contains(rec.Message, "canary's deployment is not available") {
		t.Errorf("a step unhealthy past its deadline: %+v", rec)
	}
	if !slices.Equal(j.reasons, []string{"RolloutStep", "RolloutHalted"}) {
		t.Errorf("transitions %v", j.reasons)
	}
}

// fetched is a Recorder whose Fetch returns rec: the record another
// replica of a sharded group keeps.
type fetched struct {
	journal
	rec *Record
}

func (f *fetched) Fetch(context.Context) (*Record, error) { return f.rec, nil }

// TestFollowStepsByCluster: a replica of a sharded group that follows a
// rollout by cluster queues every trigger of its own when the record's
// step changes — the clusters reached changed, though no trigger changed
// revision — and none when it reads the same step again.
func TestFollowStepsByCluster(t *testing.T) {
	began := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h := newHost(t, 3, began.Add(-time.Hour))
	s := rules.Rollout{Strategy: rules.RolloutProgressive, Step: percent(10), ProgressDeadline: time.Hour,
		MaxPrunes: percent(100), Clusters: clusterSteps(t, 1)}
	r := &rules.Rule{Name: "roll", Content: rules.Content{Hash: "new0123456789"}, RunOptions: rules.RunOptions{Rollout: s}}
	from := &rules.Rule{Name: "roll", Content: rules.Content{Hash: "old0123456789"}}
	out := &fetched{}
	c := New(r, Plan{From: from, Rec: Record{Started: began}}, true, h, out)
	ctx := context.Background()
	step := func(n int) *Record {
		return &Record{From: "old0123456789", To: "new0123456789", State: Progressing, Step: n, Steps: 2,
			Threshold: math.MaxUint64, Started: began, Moved: 3, Total: 3}
	}
	out.rec = step(1)
	c.follow(ctx)
	if got := h.takeRequeued(); len(got) != 3 {
		t.Fatalf("following step 1 queued %d triggers, want 3", len(got))
	}
	c.follow(ctx)
	if got := h.takeRequeued(); len(got) != 0 {
		t.Fatalf("reading step 1 again queued %v", got)
	}
	out.rec = step(2)
	c.follow(ctx)
	if got := h.takeRequeued(); len(got) != 3 {
		t.Fatalf("following step 2 queued %d triggers, want all 3: the clusters they reach changed", len(got))
	}
	if st := c.Status(); !st.ByCluster || st.Step != 2 {
		t.Errorf("status %+v", st)
	}
}

// TestShardedHealthReadsRecord: the coordinator of a sharded group judges
// a step from the caches with Host.Health, which renders — and a render
// of a rollout by cluster reads the record to know the clusters held
// back. Called under the coordinator's lock it deadlocked (every
// reconcile and /readyz with it); the judgement counts, and the step
// moves on once every trigger is healthy.
func TestShardedHealthReadsRecord(t *testing.T) {
	began := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	h := newHost(t, 3, began.Add(-time.Hour))
	h.stepClusters = [][]string{{"canary"}}
	s := rules.Rollout{Strategy: rules.RolloutProgressive, Step: percent(10), ProgressDeadline: time.Hour,
		MaxPrunes: percent(100), Clusters: clusterSteps(t, 1)}
	r := &rules.Rule{Name: "roll", Content: rules.Content{Hash: "new0123456789"}, RunOptions: rules.RunOptions{Rollout: s}}
	from := &rules.Rule{Name: "roll", Content: rules.Content{Hash: "old0123456789"}}
	c := New(r, Plan{From: from, Rec: Record{Started: began}}, true, h, &journal{})
	var ready atomic.Bool
	h.health = func(context.Context, cache.ObjectName) Health {
		if rec := c.Record(); rec.Step == 0 { // as a render's held clusters read it
			return Health{Why: "no step"}
		}
		if !ready.Load() {
			return Health{Why: "canary's copy is not ready"}
		}
		return Health{OK: true}
	}
	ctx := context.Background()
	c.begin(ctx)
	checked := func() {
		t.Helper()
		done := make(chan struct{})
		go func() { c.check(ctx); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a check judging the step from the caches did not return: deadlocked on the record")
		}
	}
	checked()
	if rec := c.Record(); rec.Step != 1 {
		t.Fatalf("moved on with the canary's copies not ready: %+v", rec)
	}
	ready.Store(true)
	checked()
	if rec := c.Record(); rec.Step != 2 {
		t.Errorf("every trigger healthy in the caches, yet the step did not move: %+v", rec)
	}
}
