package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// The memory phase (#28, item 6): N Tenants, one ConfigMap each, created
// once; the hand-written controller, syncloop, and replicas syncloop
// replicas sharing the triggers (run --sharding) each converge them from
// process start, the children deleted between runs, and what each process
// holds resident once converged and idle is recorded.

// MemoryResult is the memory phase. JSON names are the benchmark's
// contract.
type MemoryResult struct {
	Triggers int         `json:"triggers"`
	Runs     []MemoryRun `json:"runs"`
	// RSSRatio is syncloop's resident memory over the hand-written
	// controller's; ShardedRatio the sharded replicas' summed over
	// syncloop's alone.
	RSSRatio     float64 `json:"rss_ratio"`
	ShardedRatio float64 `json:"sharded_ratio"`
}

// MemoryRun is one controller's run: its processes' measures summed.
type MemoryRun struct {
	// Controller is "hand-written", "syncloop" or "syncloop --sharding".
	Controller string `json:"controller"`
	Replicas   int    `json:"replicas"`
	// ConvergenceSeconds: processes started → every child created.
	ConvergenceSeconds float64 `json:"convergence_seconds"`
	// CPUSeconds: the processes' CPU time, start to the end of the idle
	// period.
	CPUSeconds float64 `json:"cpu_seconds"`
	// RSSBytes: resident memory after the idle period; PeakRSSBytes the
	// processes' peaks; HeapInuseBytes the Go heap's spans in use then
	// (go_memstats_heap_inuse_bytes), live objects and not yet collected
	// garbage together.
	RSSBytes       int64 `json:"rss_bytes"`
	PeakRSSBytes   int64 `json:"peak_rss_bytes"`
	HeapInuseBytes int64 `json:"heap_inuse_bytes"`
	// RSSPerTriggerBytes is RSSBytes over the triggers (each trigger and
	// its child cached).
	RSSPerTriggerBytes float64 `json:"rss_per_trigger_bytes"`
}

// runMemory runs the memory phase on env with n Tenants, the sharded run
// with replicas replicas, each run idle for idle after converging.
func runMemory(ctx context.Context, env *testenv.Env, bin string, n, replicas int, idle time.Duration, logf func(string, ...any)) (*MemoryResult, error) {
	if err := installTenantCRD(ctx, env); err != nil {
		return nil, err
	}
	cs, dc, err := adminClients(env)
	if err != nil {
		return nil, err
	}
	pcs, err := protobufAdmin(env)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "syncloop-bench-memory-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ns, err := namespace(ctx, cs, "bench-memory-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tenant.yaml"), []byte(strings.ReplaceAll(tenantRule, "NS", ns)), 0o644); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := tenantWorkload(tenantRule).create(ctx, dc, ns, n); err != nil {
		return nil, err
	}
	logf("memory: %d Tenants created in %.1fs", n, time.Since(start).Seconds())

	kubeconfig := env.Kubeconfig()
	res := &MemoryResult{Triggers: n}
	for _, c := range []struct {
		name     string
		replicas int
		children string
		start    func(i int, logPath string) (*syncloopRun, error)
	}{
		{handCtl.name, 1, handCtl.children, func(_ int, logPath string) (*syncloopRun, error) {
			return startHandTenants(kubeconfig, ns, logPath)
		}},
		{syncloopCtl.name, 1, syncloopCtl.children, func(_ int, logPath string) (*syncloopRun, error) {
			return startSyncloop(bin, dir, kubeconfig, logPath)
		}},
		{syncloopCtl.name + " --sharding", replicas, syncloopCtl.children, func(i int, logPath string) (*syncloopRun, error) {
			return startSyncloop(bin, dir, kubeconfig, logPath, "--sharding", "--leader-elect-namespace", ns,
				"--leader-elect-id", "bench-memory", "--leader-elect-identity", fmt.Sprintf("replica-%d", i))
		}},
	} {
		run, err := memoryRun(ctx, cs, pcs, ns, dir, n, c.replicas, c.children, c.start, idle)
		if err != nil {
			return nil, fmt.Errorf("memory (%s): %w", c.name, err)
		}
		run.Controller = c.name
		logf("memory (%s, %d process(es)): converged %d triggers in %.1fs, %.1f CPU seconds; RSS %.0f MiB (peak %.0f), %.0f B per trigger; Go heap in use %.0f MiB",
			c.name, c.replicas, n, run.ConvergenceSeconds, run.CPUSeconds, mib(run.RSSBytes), mib(run.PeakRSSBytes), run.RSSPerTriggerBytes, mib(run.HeapInuseBytes))
		res.Runs = append(res.Runs, *run)
	}
	res.RSSRatio = float64(res.Runs[1].RSSBytes) / float64(res.Runs[0].RSSBytes)
	res.ShardedRatio = float64(res.Runs[2].RSSBytes) / float64(res.Runs[1].RSSBytes)
	// The control plane has no namespace controller: the Tenants go
	// first, then the namespace.
	err = deleteAll(ctx, func(ctx context.Context) error {
		return dc.Resource(tenants).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	}, func(ctx context.Context) (bool, error) {
		left, err := dc.Resource(tenants).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(left.Items) == 0, err
	})
	if err != nil {
		return nil, err
	}
	_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	return res, nil
}

// memoryRun starts replicas processes with start, waits until the n
// children labelled children exist, lets them idle, measures and stops
// them, and deletes the children.
func memoryRun(ctx context.Context, cs, pcs kubernetes.Interface, ns, dir string, n, replicas int, children string,
	start func(i int, logPath string) (*syncloopRun, error), idle time.Duration) (*MemoryRun, error) {
	watched, err := watchChildren(ctx, pcs, ns, children)
	if err != nil {
		return nil, err
	}
	defer watched.stop()
	var procs []*syncloopRun
	defer func() { _ = stopAll(procs) }()
	began := time.Now()
	for i := range replicas {
		p, err := start(i, filepath.Join(dir, fmt.Sprintf("%s-%d.log", ns, len(procs))))
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		for i, p := range procs {
			if err := p.exited(); err != nil {
				return false, fmt.Errorf("process %d: %w", i, err)
			}
		}
		got, _, err := watched.count("")
		return got >= n, err
	}); err != nil {
		return nil, fmt.Errorf("converging: %w", err)
	}
	run := &MemoryRun{Replicas: replicas, ConvergenceSeconds: time.Since(began).Seconds()}
	time.Sleep(idle) // a measuring period, not a wait for a condition
	for i, p := range procs {
		m, err := p.scrape(ctx)
		if err != nil {
			return nil, fmt.Errorf("process %d: %w", i, err)
		}
		run.CPUSeconds += m["process_cpu_seconds_total"]
		run.HeapInuseBytes += int64(m["go_memstats_heap_inuse_bytes"])
		status := p.status()
		run.RSSBytes += procKB(status, "VmRSS:") << 10
		run.PeakRSSBytes += procKB(status, "VmHWM:") << 10
	}
	run.RSSPerTriggerBytes = float64(run.RSSBytes) / float64(n)
	if err := stopAll(procs); err != nil {
		return nil, err
	}
	// Every child was made by one of these processes, and goes before the
	// next run's controller starts.
	list, err := pcs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: children, ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	if len(list.Items) != n {
		return nil, fmt.Errorf("%d children, want %d", len(list.Items), n)
	}
	err = deleteAll(ctx, func(ctx context.Context) error {
		return cs.CoreV1().ConfigMaps(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: children})
	}, func(ctx context.Context) (bool, error) {
		left, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: children, Limit: 1})
		return err == nil && len(left.Items) == 0, err
	})
	return run, err
}

// deleteAll deletes a collection until none of it is left: a collection
// of 100,000 takes the API server longer than a request may last, and
// what one DeleteCollection left when its time ran out goes in the next.
func deleteAll(ctx context.Context, del func(context.Context) error, gone func(context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		_ = del(ctx) // a timeout is expected; gone decides
		return gone(ctx)
	})
}

// reportMemory is the Markdown table of the memory phase.
func reportMemory(r *MemoryResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — memory, N = %d\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s; kube-apiserver %s, a control plane of its own. %d Tenants created first, each needing one ConfigMap; each controller converges them from its start, the children deleted between runs. syncloop with its defaults; the hand-written client-go controller as in the tenant phase (a typed ConfigMap informer keeping managedFields, as client-go's does unless told otherwise).\n\n",
		cpuModel(), runtime.NumCPU(), memTotal(), testenv.KubeVersion, r.Triggers)
	fmt.Fprintf(&b, "| controller | processes | convergence | CPU | RSS after idle | peak RSS | RSS per trigger | Go heap in use |\n|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		fmt.Fprintf(&b, "| %s | %d | %.1f s | %.1f s | %.0f MiB | %.0f MiB | %.0f B | %.0f MiB |\n",
			run.Controller, run.Replicas, run.ConvergenceSeconds, run.CPUSeconds, mib(run.RSSBytes), mib(run.PeakRSSBytes), run.RSSPerTriggerBytes, mib(run.HeapInuseBytes))
	}
	fmt.Fprintf(&b, "\nRSS ratios: syncloop / hand-written %.2f×; %d sharded replicas together / syncloop alone %.2f×.\n",
		r.RSSRatio, r.Runs[2].Replicas, r.ShardedRatio)
	return b.String()
}
