package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// rolloutRule: every trigger has one child holding VALUE; STRATEGY is the
// rule's rollout strategy. No readyWhen: a step is healthy once its
// children are applied.
const rolloutRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench-rollout}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  rollout: {strategy: STRATEGY}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-child"}
        data: {value: VALUE}
  resyncPeriod: "0"
`

// RolloutResult is the rollout phase's outcome: one change of a rule over
// n triggers, at once and in steps.
type RolloutResult struct {
	Triggers int `json:"triggers"`
	// Seconds from the change to the n-th child updated, and the writes
	// it took (n is the floor), for each strategy.
	ImmediateSeconds   float64 `json:"immediateSeconds"`
	ImmediateWrites    int64   `json:"immediateWrites"`
	ProgressiveSeconds float64 `json:"progressiveSeconds"`
	ProgressiveWrites  int64   `json:"progressiveWrites"`
	// Ratio is progressive / immediate time.
	Ratio float64 `json:"ratio"`
}

// runRollout converges n triggers under a rule, changes the rule's child
// and times the change until every child shows it: with strategy
// Immediate, then — in a namespace of its own — Progressive (the default:
// ten steps of 10%, each once the one before is applied).
func runRollout(ctx context.Context, env *testenv.Env, n int, logf func(string, ...any)) (*RolloutResult, error) {
	res := &RolloutResult{Triggers: n}
	for _, strategy := range []rules.RolloutStrategy{rules.RolloutImmediate, rules.RolloutProgressive} {
		took, writes, err := rolloutOnce(ctx, env, n, strategy)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", strategy, err)
		}
		logf("rollout %s: a change of the rule reached %d children in %.2fs (%d writes)", strategy, n, took.Seconds(), writes)
		if strategy == rules.RolloutImmediate {
			res.ImmediateSeconds, res.ImmediateWrites = took.Seconds(), writes
		} else {
			res.ProgressiveSeconds, res.ProgressiveWrites = took.Seconds(), writes
		}
	}
	res.Ratio = res.ProgressiveSeconds / res.ImmediateSeconds
	return res, nil
}

func rolloutOnce(ctx context.Context, env *testenv.Env, n int, strategy rules.RolloutStrategy) (time.Duration, int64, error) {
	rule := func(value string) string {
		return strings.NewReplacer("STRATEGY", string(strategy), "VALUE", value).Replace(rolloutRule)
	}
	w := configMapWorkload(rule("a"))
	ns, _, set, err := w.prepare(ctx, env, n, "bench-rollout-", nil)
	if err != nil {
		return 0, 0, err
	}
	changed, err := parseRules([2]string{"bench-rollout.yaml", strings.ReplaceAll(rule("b"), "NS", ns)})
	if err != nil {
		return 0, 0, err
	}
	next, err := rules.NewSet(changed...)
	if err != nil {
		return 0, 0, err
	}
	eng, m, _, _, err := newEngine(syncloopConfig(env.Config(), Config{}), n)
	if err != nil {
		return 0, 0, err
	}
	updates := make(chan *rules.Set, 1)
	_, stop := runEngine(ctx, eng, set, updates)
	defer stop()
	converged := func(target int64) error {
		return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
			return m.writes.Load() >= target, nil
		})
	}
	if err := converged(int64(n)); err != nil {
		return 0, 0, fmt.Errorf("syncloop did not converge: %d of %d children", m.writes.Load(), n)
	}
	time.Sleep(2 * time.Second) // the echoes of the creates
	before := m.writes.Load()
	m.target.Store(before + int64(n))
	start := time.Now()
	updates <- next
	if err := converged(before + int64(n)); err != nil {
		return 0, 0, fmt.Errorf("the change did not reach every child: %d of %d", m.writes.Load()-before, n)
	}
	took := time.Unix(0, m.reached.Load()).Sub(start)
	time.Sleep(2 * time.Second) // writes beyond one per child would show here
	return took, m.writes.Load() - before, nil
}

// reportRollout is the Markdown table of the rollout phase.
func reportRollout(r *RolloutResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — rollout: one change of a rule over %d triggers\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "syncloop's defaults, in process; the rule's child changes once syncloop has converged; no readyWhen (a step is healthy once applied).\n\n")
	fmt.Fprintf(&b, "| strategy | change → all %d children updated | writes (one per child is the floor) |\n|---|---|---|\n", r.Triggers)
	fmt.Fprintf(&b, "| Immediate | %.2f s | %d |\n", r.ImmediateSeconds, r.ImmediateWrites)
	fmt.Fprintf(&b, "| Progressive (default: 10 steps of 10%%) | %.2f s | %d |\n", r.ProgressiveSeconds, r.ProgressiveWrites)
	fmt.Fprintf(&b, "| ratio (progressive / immediate) | %.3f | |\n", r.Ratio)
	return b.String()
}
