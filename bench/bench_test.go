package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(handTenantsEnv) != "" { // the tenant workload's hand-written controller
		os.Exit(handTenantsMain(os.Args[1:]))
	}
	testenv.Main(m, testenv.Options{})
}

// TestBenchSmoke runs the benchmark small. It asserts the counts — every
// child applied, nothing at all requested in steady state — never times.
func TestBenchSmoke(t *testing.T) {
	env := testenv.Get(t)
	res, err := Run(t.Context(), env, Config{Triggers: 50, LimitWorkers: 8, Resync: 2 * time.Second, Updates: 20, Cycles: 5, Rules: 10, Rounds: 2}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.SteadyWrites != 0 || res.SteadyReads != 0 {
		t.Errorf("steady state: %d writes, %d reads; want 0 and 0", res.SteadyWrites, res.SteadyReads)
	}
	if res.InformersDelta != 0 {
		t.Errorf("rule add/remove cycles left %+d informers", res.InformersDelta)
	}
	if res.ConvergenceSeconds <= 0 || res.LimitSeconds <= 0 || res.HandWrittenBeforeSeconds <= 0 || res.HandWrittenAfterSeconds <= 0 ||
		res.HandWrittenSeconds != (res.HandWrittenBeforeSeconds+res.HandWrittenAfterSeconds)/2 {
		t.Errorf("times not measured: %+v", res)
	}
	if res.CPUSeconds <= 0 || res.HandWrittenCPUSeconds <= 0 || res.CPURatio != res.CPUSeconds/res.HandWrittenCPUSeconds {
		t.Errorf("CPU not measured: syncloop %.3f s, hand-written %.3f s, ratio %.3f", res.CPUSeconds, res.HandWrittenCPUSeconds, res.CPURatio)
	}
	if len(res.Rounds) != 2 || res.Rounds[0].Ratio != res.HandWrittenRatio || res.Rounds[1].Seconds <= 0 || res.Rounds[1].HandWrittenCPUSeconds <= 0 || res.MedianRatio <= 0 || res.MedianCPURatio <= 0 {
		t.Errorf("rounds not measured: %+v, medians %.3f, %.3f", res.Rounds, res.MedianRatio, res.MedianCPURatio)
	}
	t.Logf("%+v", res)
}

// TestFanoutSmoke runs the fan-out phase small: one change of the source
// reaches every child with exactly one write each.
func TestFanoutSmoke(t *testing.T) {
	res, err := runFanout(t.Context(), testenv.Get(t), 50, 8, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.Writes != 50 {
		t.Errorf("the source change made %d writes, want one per child (50)", res.Writes)
	}
	if res.Seconds <= 0 || res.LimitSeconds <= 0 {
		t.Errorf("times not measured: %+v", res)
	}
}

// TestRolloutSmoke runs the rollout phase small: a change of the rule
// costs one write per child whether it moves at once or in steps.
func TestRolloutSmoke(t *testing.T) {
	res, err := runRollout(t.Context(), testenv.Get(t), 50, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.ImmediateWrites != 50 || res.ProgressiveWrites != 50 {
		t.Errorf("the change made %d writes at once and %d in steps, want one per child (50)", res.ImmediateWrites, res.ProgressiveWrites)
	}
	if res.ImmediateSeconds <= 0 || res.ProgressiveSeconds <= 0 {
		t.Errorf("times not measured: %+v", res)
	}
}

// TestIdentitiesSmoke runs the identity phase small: rules acting as
// syncloop, as one ServiceAccount and as one each converge, with the
// informers each way needs, and make no request at steady state.
func TestIdentitiesSmoke(t *testing.T) {
	res, err := runIdentities(t.Context(), testenv.Get(t), 2, 20, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	// syncloop's own and one ServiceAccount: the trigger informer shared
	// and a child informer per rule; two: all four of their own.
	for i, want := range []int{3, 3, 4} {
		run := res.Runs[i]
		if run.Informers != want || run.SteadyRequests != 0 || run.Seconds <= 0 || run.HeapMiB <= 0 {
			t.Errorf("as %s: %+v, want %d informers, 0 requests at steady state, time and heap measured", run.ActAs, run, want)
		}
	}
}

// TestFleetSmoke runs the fleet phase small: two workload clusters get a
// child of each trigger, written once, and nothing is asked of any
// cluster at steady state; a change stepping by cluster writes each child
// once more.
func TestFleetSmoke(t *testing.T) {
	res, err := runFleet(t.Context(), testenv.Get(t), 20, 2, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.WritesPerChild != 1 || res.SteadyRequests != 0 || res.Seconds <= 0 || res.HeapPerClusterMiB <= 0 {
		t.Errorf("%+v, want one write per child, 0 requests at steady state, time and heap measured", res)
	}
	// Two clusters, w0 and w1: a step each, and the rest's, empty.
	if res.RolloutSteps != 3 || res.RolloutWrites != 40 || res.RolloutSeconds <= 0 {
		t.Errorf("the change by cluster: %d steps, %d writes in %.2fs; want 3 steps and one write per child", res.RolloutSteps, res.RolloutWrites, res.RolloutSeconds)
	}
}

// TestChainSmoke runs the chain phase small: three dependent children per
// trigger, exactly one write each.
func TestChainSmoke(t *testing.T) {
	res, err := runChain(t.Context(), testenv.Get(t), 50, 8, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.WritesPerTrigger != chainLength {
		t.Errorf("%.2f writes per trigger, want %d (one per child)", res.WritesPerTrigger, chainLength)
	}
	if res.Seconds <= 0 || res.LimitSeconds <= 0 {
		t.Errorf("times not measured: %+v", res)
	}
}

// TestFunctionSmoke runs the function phase small: each way converges,
// and the report says so.
func TestFunctionSmoke(t *testing.T) {
	res, err := runFunction(t.Context(), testenv.Get(t), 50, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.TemplateSeconds <= 0 || res.ServedSeconds <= 0 || res.FreshSeconds <= 0 || res.WebhookSeconds <= 0 || res.Ratio <= 0 {
		t.Errorf("times not measured: %+v", res)
	}
	if rep := reportFunction(res); !strings.Contains(rep, "| a function, served |") || !strings.Contains(rep, "| a webhook") {
		t.Errorf("report:\n%s", rep)
	}
}

// TestShardSmoke runs the sharding phase small with a syncloop binary
// built for it: each run creates every child exactly once, and in the
// sharded run every replica creates some — once all have joined with work
// left (a replica that starts late on a loaded machine may find its
// share done by the others, as sharding means it to).
func TestShardSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the syncloop binary")
	}
	bin := syncloopBinary(t)
	// Enough triggers to outlast the replicas' joining on a loaded
	// machine (2.5 s in CI, where one replica makes 60 children in 1.7 s).
	const n = 240
	res, err := runShard(t.Context(), testenv.Get(t), bin, n, 3, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || res.Runs[0].Replicas != 1 || res.Runs[1].Replicas != 3 {
		t.Fatalf("runs %+v, want 1 replica then 3", res.Runs)
	}
	for _, run := range res.Runs {
		sum := 0
		// Joined a second before the last child (a handover takes the
		// in-flight work's time): every replica had work to take.
		joinedEarly := run.Replicas == 1 || run.JoinedSeconds < run.ConvergenceSeconds-1
		for i, c := range run.Creates {
			sum += c
			switch {
			case c == 0 && joinedEarly:
				t.Errorf("%d replicas: replica %d created nothing, all having joined after %.2fs of %.2fs", run.Replicas, i, run.JoinedSeconds, run.ConvergenceSeconds)
			case c == 0:
				t.Logf("%d replicas: replica %d created nothing: the replicas joined only after %.2fs, the children were all made after %.2fs", run.Replicas, i, run.JoinedSeconds, run.ConvergenceSeconds)
			}
		}
		if sum != n {
			t.Errorf("%d replicas created %d children for %d triggers", run.Replicas, sum, n)
		}
	}
	if res.Runs[1].JoinedSeconds <= 0 || res.Ratio <= 0 {
		t.Errorf("times not measured: %+v", res)
	}
}

// syncloopBinary builds cmd/syncloop once for the package's tests.
func syncloopBinary(t *testing.T) string {
	t.Helper()
	built.Do(func() {
		dir, err := os.MkdirTemp("", "syncloop-bench-bin-")
		if err != nil {
			built.err = err
			return
		}
		built.bin = filepath.Join(dir, "syncloop")
		args := []string{"build", "-o", built.bin}
		if raceEnabled { // reuses the packages `go test -race` has built
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, "../cmd/syncloop")...).CombinedOutput(); err != nil {
			built.err = fmt.Errorf("building syncloop: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

var built struct {
	sync.Once
	bin string
	err error
}

// TestTenantsSmoke runs the tenant workload's phase small: the
// hand-written controller and syncloop each converge every way — Tenants
// pre-created, streamed in, streamed in as ServiceAccounts — with one
// apply per trigger, every ConfigMap controlled by its Tenant (checked by
// the run), the updates reflected and nothing written while idle.
func TestTenantsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the syncloop binary")
	}
	const n = 60
	res, err := runTenants(t.Context(), testenv.Get(t), TenantRun{Syncloop: syncloopBinary(t), Triggers: n, Updates: 10,
		Idle: time.Second, LimitWorkers: 8}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pairs) != 3 {
		t.Fatalf("%d ways of running, want 3", len(res.Pairs))
	}
	for i, p := range res.Pairs {
		for _, r := range []*ProcessResult{p.HandWritten, p.Syncloop} {
			if r.Streamed != (i > 0) || r.AsServiceAccounts != (i == 2) {
				t.Errorf("way %d: %s streamed %v, as ServiceAccounts %v", i, r.Controller, r.Streamed, r.AsServiceAccounts)
			}
			// One apply per trigger; syncloop also records its rule's
			// revision at start (one ControllerRevision created).
			extra := 0
			if r.Controller == "syncloop" {
				extra = 1
			}
			if r.Writes != n+extra || r.IdleWrites != 0 || r.FailedEvents != 0 {
				t.Errorf("way %d, %s: %d writes, %d idle writes, %d Failed Events; want %d, 0, 0", i, r.Controller, r.Writes, r.IdleWrites, r.FailedEvents, n+extra)
			}
			if r.ConvergenceSeconds <= 0 || r.CPUSeconds <= 0 || r.ControlPlaneCPUSeconds <= 0 || r.RSSAtConvergenceBytes <= 0 || r.ClientSeconds <= 0 || r.ClientP99Ms < r.ClientP50Ms {
				t.Errorf("way %d, %s: not measured: %+v", i, r.Controller, r)
			}
			if want := i == 0; (r.UpdateSeconds > 0) != want {
				t.Errorf("way %d, %s: updates timed %v, want %v", i, r.Controller, r.UpdateSeconds, want)
			}
		}
		if p.HandWritten.Controller != "hand-written" || p.Syncloop.Controller != "syncloop" || p.Ratio <= 0 || p.CPURatio <= 0 {
			t.Errorf("way %d: %+v", i, p)
		}
	}
	if report := reportTenants(TenantRun{Triggers: n, LimitWorkers: 8}, res); strings.Count(report, "| convergence: process start") != 3 {
		t.Errorf("the report has not three tables:\n%s", report)
	}
}

// TestMedianPair: a way's rounds stand as one pair of medians, each
// ratio the median of the rounds' own.
func TestMedianPair(t *testing.T) {
	pr := func(conv, cpu float64, writes int, rss int64) *ProcessResult {
		return &ProcessResult{Controller: "c", Streamed: true, ConvergenceSeconds: conv, CPUSeconds: cpu, Writes: writes, RSSBytes: rss}
	}
	got := medianPair([]TenantPair{
		{HandWritten: pr(10, 2, 100, 30), Syncloop: pr(11, 3, 101, 40), Ratio: 0.9, CPURatio: 1.5},
		{HandWritten: pr(14, 1, 100, 10), Syncloop: pr(13, 1, 103, 20), Ratio: 1.1, CPURatio: 1.0},
		{HandWritten: pr(12, 4, 100, 20), Syncloop: pr(20, 5, 102, 30), Ratio: 0.6, CPURatio: 1.25},
	})
	h, s := got.HandWritten, got.Syncloop
	if h.ConvergenceSeconds != 12 || h.CPUSeconds != 2 || h.Writes != 100 || h.RSSBytes != 20 || !h.Streamed || h.Controller != "c" {
		t.Errorf("hand-written medians: %+v", h)
	}
	if s.ConvergenceSeconds != 13 || s.CPUSeconds != 3 || s.Writes != 102 || s.RSSBytes != 30 {
		t.Errorf("syncloop medians: %+v", s)
	}
	if got.Ratio != 0.9 || got.CPURatio != 1.25 {
		t.Errorf("ratios %v / %v, want the medians of the rounds' 0.9 and 1.25", got.Ratio, got.CPURatio)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of four: %v, want 2.5", m)
	}
}

// TestMemorySmoke runs the memory phase small: the hand-written
// controller, syncloop and three sharded replicas each converge the same
// Tenants (every child made, none left over between runs — checked by the
// run), and each run's memory is measured.
func TestMemorySmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the syncloop binary")
	}
	const n = 60
	res, err := runMemory(t.Context(), testenv.Get(t), syncloopBinary(t), n, 3, 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 3 || res.Triggers != n {
		t.Fatalf("%d runs of %d triggers, want 3 of %d", len(res.Runs), res.Triggers, n)
	}
	for i, want := range []struct {
		name     string
		replicas int
	}{{"hand-written", 1}, {"syncloop", 1}, {"syncloop --sharding", 3}} {
		r := res.Runs[i]
		if r.Controller != want.name || r.Replicas != want.replicas {
			t.Errorf("run %d: %s with %d processes, want %s with %d", i, r.Controller, r.Replicas, want.name, want.replicas)
		}
		if r.ConvergenceSeconds <= 0 || r.CPUSeconds <= 0 || r.RSSBytes <= 0 || r.PeakRSSBytes < r.RSSBytes || r.HeapInuseBytes <= 0 ||
			r.RSSPerTriggerBytes != float64(r.RSSBytes)/n {
			t.Errorf("run %d (%s): not measured: %+v", i, r.Controller, r)
		}
	}
	if res.RSSRatio != float64(res.Runs[1].RSSBytes)/float64(res.Runs[0].RSSBytes) ||
		res.ShardedRatio != float64(res.Runs[2].RSSBytes)/float64(res.Runs[1].RSSBytes) {
		t.Errorf("ratios %v %v", res.RSSRatio, res.ShardedRatio)
	}
	if table := reportMemory(res); !strings.Contains(table, "| syncloop --sharding | 3 |") {
		t.Errorf("table:\n%s", table)
	}
}
