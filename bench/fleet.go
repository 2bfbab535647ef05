package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// fleetRule: each trigger gets a copy in every cluster of the inventory
// labelled bench=on; a resync every 5 s, which the steady state spans
// twice.
const fleetRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench-fleet}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  resources:
    - id: copy
      clusters: {selector: "cluster.labels.?bench.orValue('') == 'on'"}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}", namespace: default}
        data: {value: "${object.data.value}", cluster: "${cluster.name}"}
  resyncPeriod: 5s
`

// fleetResync is fleetRule's resync period.
const fleetResync = 5 * time.Second

// FleetResult is the fleet phase's outcome: triggers in the management
// cluster, each with one child in every workload cluster.
type FleetResult struct {
	Clusters int `json:"clusters"`
	Triggers int `json:"triggers"`
	// Seconds from the kubeconfig Secrets created to the last child
	// written; WritesPerChild the creates and updates per child.
	Seconds        float64 `json:"seconds"`
	WritesPerChild float64 `json:"writesPerChild"`
	// SteadyRequests are the requests to every cluster over two resyncs
	// with everything in sync.
	SteadyRequests int `json:"steadyRequests"`
	// HeapPerClusterMiB is the heap a workload cluster costs, its children
	// cached: (heap converged − heap with the triggers and no cluster) /
	// clusters, after GC.
	HeapPerClusterMiB float64 `json:"heapPerClusterMiB"`
	Informers         int     `json:"informers"`
	// RolloutSeconds is how long a change of the rule took to reach every
	// child stepping by cluster (fleetSteps), RolloutWrites the writes it
	// made, RolloutSteps its steps.
	RolloutSeconds float64 `json:"rolloutSeconds"`
	RolloutWrites  int64   `json:"rolloutWrites"`
	RolloutSteps   int     `json:"rolloutSteps"`
}

// fleetSteps are the steps by cluster of the fleet phase's change: w0,
// then w1 and w2, then the rest.
const fleetSteps = `  rollout:
    clusters:
      - selector: "cluster.name == 'w0'"
      - selector: "cluster.name in ['w1', 'w2']"
`

// runFleet starts clusters workload control planes, puts n triggers in
// the management cluster (env), and has syncloop, in process with the
// fleet inventory `run` makes, put a child of each in every workload
// cluster once their kubeconfig Secrets appear.
func runFleet(ctx context.Context, env *testenv.Env, n, clusters int, logf func(string, ...any)) (*FleetResult, error) {
	workloads, err := startFleet(ctx, clusters)
	defer func() {
		for _, w := range workloads {
			w.Stop()
		}
	}()
	if err != nil {
		return nil, err
	}
	w := configMapWorkload(fleetRule)
	ns, _, set, err := w.prepare(ctx, env, n, "bench-fleet-", nil)
	if err != nil {
		return nil, err
	}
	admin, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	counter := &testenv.RequestCounter{}
	inv := fleet.New(admin, ns, fleet.Options{Configure: func(cfg *rest.Config) {
		*cfg = *counter.Wrap(syncloopConfig(cfg, Config{}))
	}})
	changed, err := parseRules([2]string{"bench-fleet.yaml", strings.ReplaceAll(strings.Replace(fleetRule, `"${cluster.name}"}`, `"${cluster.name}", rev: "2"}`, 1)+fleetSteps, "NS", ns)})
	if err != nil {
		return nil, err
	}
	next, err := rules.NewSet(changed...)
	if err != nil {
		return nil, err
	}
	eng, m, _, _, err := newFleetEngine(counter.Wrap(syncloopConfig(env.Config(), Config{})), n*clusters, inv)
	if err != nil {
		return nil, err
	}
	invCtx, stopInv := context.WithCancel(ctx)
	defer stopInv()
	go inv.Run(invCtx)
	base := heapAfterGC()
	updates := make(chan *rules.Set, 1)
	_, stop := runEngine(ctx, eng, set, updates)
	defer stop()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Minute, true, func(context.Context) (bool, error) {
		return m.reconciles.Load() >= int64(n), nil
	}); err != nil {
		return nil, fmt.Errorf("the triggers were not reconciled: %d of %d", m.reconciles.Load(), n)
	}
	alone := heapAfterGC()

	start := time.Now()
	for _, wl := range workloads {
		if err := putKubeconfig(ctx, admin, ns, wl); err != nil {
			return nil, err
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		return m.writes.Load() >= int64(n*clusters), nil
	}); err != nil {
		return nil, fmt.Errorf("syncloop did not converge: %d of %d children", m.writes.Load(), n*clusters)
	}
	res := &FleetResult{Clusters: clusters, Triggers: n, Seconds: time.Unix(0, m.reached.Load()).Sub(start).Seconds()}
	for _, wl := range workloads {
		if got, err := wl.children(ctx); err != nil || got != n {
			return nil, fmt.Errorf("cluster %s has %d children, want %d (%v)", wl.name, got, n, err)
		}
	}
	logf("fleet: %d triggers × %d clusters converged in %.2fs", n, clusters, res.Seconds)
	time.Sleep(2 * time.Second) // the echoes of the creates
	writes := m.writes.Load()
	counter.Reset()
	time.Sleep(2*fleetResync + time.Second)
	res.SteadyRequests = len(counter.Requests(nil))
	res.WritesPerChild = float64(m.writes.Load()) / float64(n*clusters)
	if m.writes.Load() != writes {
		logf("fleet: %d writes at steady state", m.writes.Load()-writes)
	}
	res.HeapPerClusterMiB = float64(int64(heapAfterGC())-int64(alone)) / float64(clusters) / (1 << 20)
	res.Informers = eng.Informers()
	logf("fleet: %.3f writes per child, %d requests over two resyncs, %.1f MiB per cluster (engine alone %.1f MiB)",
		res.WritesPerChild, res.SteadyRequests, res.HeapPerClusterMiB, float64(int64(alone)-int64(base))/(1<<20))
	runtime.KeepAlive(eng)
	if err := rolloutByCluster(ctx, eng, m, updates, next, n*clusters, res); err != nil {
		return nil, err
	}
	for _, wl := range workloads {
		if got, err := wl.changed(ctx); err != nil || got != n {
			return nil, fmt.Errorf("cluster %s has %d children changed, want %d (%v)", wl.name, got, n, err)
		}
	}
	logf("fleet: the change reached %d children in %d steps by cluster in %.2fs, %d writes", n*clusters, res.RolloutSteps, res.RolloutSeconds, res.RolloutWrites)
	return res, nil
}

// rolloutByCluster puts next, the rule changed to step by cluster, in
// force and measures how long it takes to write its children anew.
func rolloutByCluster(ctx context.Context, eng *engine.Engine, m *counts, updates chan<- *rules.Set, next *rules.Set, children int, res *FleetResult) error {
	before := m.writes.Load()
	m.target.Store(before + int64(children))
	start := time.Now()
	updates <- next
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		st := eng.Rollouts()
		return m.writes.Load() >= before+int64(children) && len(st) == 1 && st[0].State == rollout.Complete, nil
	}); err != nil {
		return fmt.Errorf("the change did not reach every child: %d of %d, rollouts %+v", m.writes.Load()-before, children, eng.Rollouts())
	}
	res.RolloutSeconds = time.Unix(0, m.reached.Load()).Sub(start).Seconds()
	res.RolloutSteps = eng.Rollouts()[0].Step
	time.Sleep(2 * time.Second) // writes beyond one per child would show here
	res.RolloutWrites = m.writes.Load() - before
	return nil
}

// fleetCluster is a workload cluster of the fleet phase.
type fleetCluster struct {
	name string
	*testenv.Env
	cs kubernetes.Interface
}

// startFleet starts n workload control planes at once.
func startFleet(ctx context.Context, n int) ([]*fleetCluster, error) {
	out := make([]*fleetCluster, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			env, err := testenv.Start(ctx, testenv.Options{})
			if err != nil {
				errs[i] = err
				return
			}
			cs, err := kubernetes.NewForConfig(env.Config())
			out[i], errs[i] = &fleetCluster{name: fmt.Sprintf("w%d", i), Env: env, cs: cs}, err
		})
	}
	wg.Wait()
	var started []*fleetCluster
	for _, c := range out {
		if c != nil {
			started = append(started, c)
		}
	}
	for _, err := range errs {
		if err != nil {
			return started, err
		}
	}
	return started, nil
}

// putKubeconfig adds w to the inventory in ns, as Cluster API writes its
// Secret, labelled bench=on.
func putKubeconfig(ctx context.Context, cs kubernetes.Interface, ns string, w *fleetCluster) error {
	kubeconfig, err := os.ReadFile(w.Kubeconfig())
	if err != nil {
		return err
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: w.name + "-kubeconfig", Labels: map[string]string{rules.LabelClusterName: w.name, "bench": "on"}},
		Data: map[string][]byte{fleet.KubeconfigKey: kubeconfig}}
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{})
	return err
}

// children counts the rule's children in w.
func (w *fleetCluster) children(ctx context.Context) (int, error) {
	l, err := w.cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=bench-fleet"})
	if err != nil {
		return 0, err
	}
	return len(l.Items), nil
}

// changed counts the rule's children in w that the change reached.
func (w *fleetCluster) changed(ctx context.Context) (int, error) {
	l, err := w.cs.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=bench-fleet"})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, cm := range l.Items {
		if cm.Data["rev"] == "2" {
			n++
		}
	}
	return n, nil
}

// reportFleet is the Markdown table of the fleet phase.
func reportFleet(r *FleetResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — fleet: %d triggers, a child each in %d workload clusters\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers, r.Clusters)
	fmt.Fprintf(&b, "syncloop's defaults, in process, with the inventory `run` makes; every control plane on this machine. Converge: from the %d kubeconfig Secrets created to the last of the %d children written. Steady state: requests to every cluster over two resyncs (%s) with everything in sync. Heap per cluster: after GC, converged, less the heap with the triggers and no cluster, divided by the clusters.\n\n",
		r.Clusters, r.Triggers*r.Clusters, fleetResync)
	fmt.Fprintf(&b, "| clusters | children | converge | writes per child | requests at steady state | heap per cluster | informers |\n|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %.2f s | %.3f | %d | %.1f MiB | %d |\n", r.Clusters, r.Triggers*r.Clusters, r.Seconds, r.WritesPerChild, r.SteadyRequests, r.HeapPerClusterMiB, r.Informers)
	fmt.Fprintf(&b, "\nThen a change of the rule, stepping by cluster (w0; w1 and w2; the rest; no readyWhen: a step is healthy once applied), from the change to the last child written anew:\n\n")
	fmt.Fprintf(&b, "| steps | children | change → all written | writes (one per child is the floor) |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| %d | %d | %.2f s | %d |\n", r.RolloutSteps, r.Triggers*r.Clusters, r.RolloutSeconds, r.RolloutWrites)
	return b.String()
}
