package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/syncloop/syncloop/internal/testenv"
)

// chainRule: three children per trigger, each reading the uid the API
// server gave the one before — a value no render can know — so they are
// applied one after the other.
const chainRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench-chain}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  resources:
    - id: a
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-a"}
        data: {value: "${object.data.value}"}
    - id: b
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-b"}
        data: {prev: "${children.a.metadata.uid}"}
    - id: c
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-c"}
        data: {prev: "${children.b.metadata.uid}"}
  resyncPeriod: "0"
`

// chainLength is how many dependent children chainRule gives a trigger.
const chainLength = 3

// ChainResult is the chain phase's outcome.
type ChainResult struct {
	Triggers int `json:"triggers"`
	// Seconds from syncloop's start to the last child of every chain.
	Seconds float64 `json:"seconds"`
	// LimitSeconds is the same chains applied from a plain loop: per
	// trigger one apply after the other, each with the uid the previous
	// returned.
	LimitSeconds float64 `json:"limitSeconds"`
	Ratio        float64 `json:"ratio"`
	// WritesPerTrigger is syncloop's writes over the triggers (the floor is
	// the chain's length), ReconcilesPerTrigger its reconciles.
	WritesPerTrigger     float64 `json:"writesPerTrigger"`
	ReconcilesPerTrigger float64 `json:"reconcilesPerTrigger"`
}

// runChain: n triggers each need a chain of three dependent children;
// measured is syncloop's convergence from a cold start with its defaults,
// against the limit.
func runChain(ctx context.Context, env *testenv.Env, n, limitWorkers int, logf func(string, ...any)) (*ChainResult, error) {
	res := &ChainResult{Triggers: n}
	w := configMapWorkload(chainRule)
	limit, err := chainLimit(ctx, env, w, n, limitWorkers)
	if err != nil {
		return nil, err
	}
	res.LimitSeconds = limit.Seconds()
	logf("chain limit: %d chains of %d from %d goroutines, no client-side limit, in %.2fs", n, chainLength, limitWorkers, res.LimitSeconds)

	_, _, set, err := w.prepare(ctx, env, n, "bench-chain-", nil)
	if err != nil {
		return nil, err
	}
	target := int64(n * chainLength)
	eng, m, _, _, err := newEngine(syncloopConfig(env.Config(), Config{}), int(target))
	if err != nil {
		return nil, err
	}
	start := time.Now()
	_, stop := runEngine(ctx, eng, set, nil)
	defer stop()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		return m.writes.Load() >= target, nil
	}); err != nil {
		return nil, fmt.Errorf("syncloop did not converge: %d of %d children", m.writes.Load(), target)
	}
	res.Seconds = time.Unix(0, m.reached.Load()).Sub(start).Seconds()
	time.Sleep(2 * time.Second) // writes beyond one per child, reconciles of echoes, would show here
	res.WritesPerTrigger = float64(m.writes.Load()) / float64(n)
	res.ReconcilesPerTrigger = float64(m.reconciles.Load()) / float64(n)
	res.Ratio = res.LimitSeconds / res.Seconds
	logf("chain: %d chains of %d converged in %.2fs (%.2f writes, %.2f reconciles per trigger)", n, chainLength, res.Seconds, res.WritesPerTrigger, res.ReconcilesPerTrigger)
	return res, nil
}

// chainLimit renders the chains offline (the uids are unknown there) and
// times applying them from a plain loop: per trigger, each child with the
// uid the previous apply returned, the triggers in parallel.
func chainLimit(ctx context.Context, env *testenv.Env, w workload, n, workers int) (time.Duration, error) {
	l, err := w.newLimitLoop(ctx, env, n, "bench-chain-limit-")
	if err != nil {
		return 0, err
	}
	defer l.close(ctx)
	children, gvrs, err := renderChildren(ctx, l.rule, l.triggers, l.mapper, nil)
	if err != nil {
		return 0, err
	}
	if len(children) != n*chainLength {
		return 0, fmt.Errorf("the rule rendered %d children for %d triggers, want %d each", len(children), n, chainLength)
	}
	for _, gvr := range gvrs {
		l.gvrs[gvr] = true
	}
	start := time.Now()
	err = parallel(ctx, n, workers, func(ctx context.Context, i int) error {
		prev := ""
		for j := range chainLength {
			obj := children[i*chainLength+j].DeepCopy()
			if j > 0 {
				_ = unstructured.SetNestedField(obj.Object, prev, "data", "prev")
			}
			out, err := l.dc.Resource(gvrs[i*chainLength+j]).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), obj,
				metav1.ApplyOptions{FieldManager: l.rule.FieldManager(), Force: true})
			if err != nil {
				return err
			}
			prev = string(out.GetUID())
		}
		return nil
	})
	return time.Since(start), err
}

// reportChain is the Markdown table of the chain phase.
func reportChain(r *ChainResult, limitWorkers int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — a chain of %d dependent resources per trigger, %d triggers\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), chainLength, r.Triggers)
	fmt.Fprintf(&b, "syncloop's defaults, in process, from a cold start; each child reads the uid the server gave the one before.\n\n")
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| start → all %d children applied | %.2f s |\n", r.Triggers*chainLength, r.Seconds)
	fmt.Fprintf(&b, "| limit: the same chains from a plain client-go loop, %d goroutines, unthrottled | %.2f s |\n", limitWorkers, r.LimitSeconds)
	fmt.Fprintf(&b, "| ratio (limit / syncloop; 1 = at the limit) | %.3f |\n", r.Ratio)
	fmt.Fprintf(&b, "| writes per trigger (%d is the floor) | %.2f |\n", chainLength, r.WritesPerTrigger)
	fmt.Fprintf(&b, "| reconciles per trigger | %.2f |\n", r.ReconcilesPerTrigger)
	return b.String()
}
