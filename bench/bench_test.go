package main

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}) }

// TestBenchSmoke runs the benchmark small. It asserts the counts — every
// child applied, nothing at all requested in steady state — never times.
func TestBenchSmoke(t *testing.T) {
	env := testenv.Get(t)
	res, err := Run(t.Context(), env, Config{Triggers: 50, LimitWorkers: 8, Resync: 2 * time.Second, Updates: 20, Cycles: 5, Rules: 10}, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if res.SteadyWrites != 0 || res.SteadyReads != 0 {
		t.Errorf("steady state: %d writes, %d reads; want 0 and 0", res.SteadyWrites, res.SteadyReads)
	}
	if res.InformersDelta != 0 {
		t.Errorf("rule add/remove cycles left %+d informers", res.InformersDelta)
	}
	if res.ConvergenceSeconds <= 0 || res.LimitSeconds <= 0 || res.HandWrittenSeconds <= 0 {
		t.Errorf("times not measured: %+v", res)
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

// TestShardSmoke runs the sharding phase small with a syncloop binary
// built for it: each run creates every child exactly once, and in the
// sharded run every replica creates some.
func TestShardSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the syncloop binary")
	}
	bin := filepath.Join(t.TempDir(), "syncloop")
	args := []string{"build", "-o", bin}
	if raceEnabled { // reuses the packages `go test -race` has built
		args = append(args, "-race")
	}
	if out, err := exec.Command("go", append(args, "../cmd/syncloop")...).CombinedOutput(); err != nil {
		t.Fatalf("building syncloop: %v\n%s", err, out)
	}
	const n = 60
	res, err := runShard(t.Context(), testenv.Get(t), bin, n, 3, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 || res.Runs[0].Replicas != 1 || res.Runs[1].Replicas != 3 {
		t.Fatalf("runs %+v, want 1 replica then 3", res.Runs)
	}
	for _, run := range res.Runs {
		sum := 0
		for i, c := range run.Creates {
			sum += c
			if c == 0 {
				t.Errorf("%d replicas: replica %d created nothing", run.Replicas, i)
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
