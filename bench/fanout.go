package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sdynamic "k8s.io/client-go/dynamic"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules/render"
)

// fanoutRule: every trigger's child copies a value from one source
// ConfigMap, read through a lookup.
const fanoutRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench-fanout}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  lookups:
    - {id: source, apiVersion: v1, kind: ConfigMap, namespace: NS, name: fanout-source}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-child"}
        data: {value: "${lookups.source.data.value}"}
  resyncPeriod: "0"
`

// FanoutResult is the fan-out phase's outcome.
type FanoutResult struct {
	Triggers int `json:"triggers"`
	// Seconds from the source's update to the N-th child updated.
	Seconds float64 `json:"seconds"`
	// LimitSeconds is the same N child updates applied from a plain loop.
	LimitSeconds float64 `json:"limitSeconds"`
	Ratio        float64 `json:"ratio"`
	// Writes is the updates syncloop made for the change (N: one each).
	Writes int64 `json:"writes"`
}

// fanoutSource is the looked-up ConfigMap, holding value.
func fanoutSource(ns, value string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "fanout-source", "namespace": ns},
		"data":     map[string]any{"value": value},
	}}
}

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// runFanout: n triggers read one source through a lookup; once syncloop has
// converged, the source changes; measured is the time until every child
// shows the change, against the limit: the very n child updates applied
// from a plain loop with no client-side limit.
func runFanout(ctx context.Context, env *testenv.Env, n, limitWorkers int, logf func(string, ...any)) (*FanoutResult, error) {
	res := &FanoutResult{Triggers: n}
	w := configMapWorkload(fanoutRule)
	limit, err := fanoutLimit(ctx, env, w, n, limitWorkers)
	if err != nil {
		return nil, err
	}
	res.LimitSeconds = limit.Seconds()
	logf("fan-out limit: %d child updates from %d goroutines, no client-side limit, in %.2fs", n, limitWorkers, res.LimitSeconds)

	ns, plain, set, err := w.prepare(ctx, env, n, "bench-fanout-", func(ns string, plain k8sdynamic.Interface) error {
		_, err := plain.Resource(configMaps).Namespace(ns).Create(ctx, fanoutSource(ns, "v1"), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	eng, m, _, _, err := newEngine(syncloopConfig(env.Config(), Config{}), n)
	if err != nil {
		return nil, err
	}
	_, stop := runEngine(ctx, eng, set, nil)
	defer stop()
	converged := func(target int64) error {
		return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
			return m.writes.Load() >= target, nil
		})
	}
	if err := converged(int64(n)); err != nil {
		return nil, fmt.Errorf("syncloop did not converge: %d of %d children", m.writes.Load(), n)
	}
	// Quiet: the echoes of the creates reconcile (and write nothing).
	time.Sleep(2 * time.Second)
	before := m.writes.Load()
	m.target.Store(before + int64(n))
	src, err := plain.Resource(configMaps).Namespace(ns).Get(ctx, "fanout-source", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	_ = unstructured.SetNestedField(src.Object, "v2", "data", "value")
	start := time.Now()
	if _, err := plain.Resource(configMaps).Namespace(ns).Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	if err := converged(before + int64(n)); err != nil {
		return nil, fmt.Errorf("the change did not reach every child: %d of %d", m.writes.Load()-before, n)
	}
	res.Seconds = time.Unix(0, m.reached.Load()).Sub(start).Seconds()
	time.Sleep(2 * time.Second) // writes beyond one per child would show here
	res.Writes = m.writes.Load() - before
	res.Ratio = res.LimitSeconds / res.Seconds
	logf("fan-out: one source change reached %d children in %.2fs (%d writes)", n, res.Seconds, res.Writes)
	return res, nil
}

// fanoutLimit applies the rule's n children rendered with the source at v1
// (untimed), then times the n applies of them rendered with v2: the same
// updates syncloop makes, sent from a plain loop.
func fanoutLimit(ctx context.Context, env *testenv.Env, w workload, n, workers int) (time.Duration, error) {
	l, err := w.newLimitLoop(ctx, env, n, "bench-fanout-limit-")
	if err != nil {
		return 0, err
	}
	defer l.close(ctx)
	if _, err := l.apply(ctx, render.Objects{fanoutSource(l.ns, "v1")}, workers); err != nil {
		return 0, err
	}
	return l.apply(ctx, render.Objects{fanoutSource(l.ns, "v2")}, workers)
}

// reportFanout is the Markdown table of the fan-out phase.
func reportFanout(r *FanoutResult, limitWorkers int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — fan-out: one lookup source read by %d triggers\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "syncloop's defaults, in process; the source is changed once syncloop has converged.\n\n")
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| source changed → all %d children updated | %.2f s |\n", r.Triggers, r.Seconds)
	fmt.Fprintf(&b, "| limit: the same %d child updates from a plain client-go loop, %d goroutines, unthrottled | %.2f s |\n", r.Triggers, limitWorkers, r.LimitSeconds)
	fmt.Fprintf(&b, "| ratio (limit / syncloop; 1 = at the limit) | %.3f |\n", r.Ratio)
	fmt.Fprintf(&b, "| writes for the change (one per child is the floor) | %d |\n", r.Writes)
	return b.String()
}
