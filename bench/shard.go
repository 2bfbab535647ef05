package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/syncloop/syncloop/internal/testenv"
)

// The shard workload: Score custom resources, each with 64 values; the
// rule's child summarises them with CEL that iterates over pairs of values
// (about 8,000 iterations a reconcile), so that a reconcile's CPU is
// mostly CEL's — the workload sharding is for.
const scoreCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: scores.bench.syncloop.dev}
spec:
  group: bench.syncloop.dev
  scope: Namespaced
  names: {plural: scores, singular: score, kind: Score, listKind: ScoreList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                values: {type: array, items: {type: integer}}
`

const scoreRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: score}
spec:
  watch: {apiVersion: bench.syncloop.dev/v1, kind: Score, namespace: NS}
  resources:
    - id: summary
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "score-${object.metadata.name}"}
        data:
          multiplesOf3: "${string(object.spec.values.map(v, v * v).filter(v, v % 3 == 0).size())}"
          aboveMedian: "${string(object.spec.values.filter(v, object.spec.values.filter(w, w < v).size() > 32).size())}"
          pairsBy7: "${string(object.spec.values.map(v, object.spec.values.filter(w, (v + w) % 7 == 0).size()).filter(c, c > 8).size())}"
`

var scores = schema.GroupVersionResource{Group: "bench.syncloop.dev", Version: "v1", Resource: "scores"}

func scoreWorkload() workload {
	return workload{rule: scoreRule, trigger: scores, make: func(i int) *unstructured.Unstructured {
		values := make([]any, 64)
		for j := range values {
			values[j] = int64((i*7919 + j*104729) % 1000)
		}
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "bench.syncloop.dev/v1", "kind": "Score",
			"metadata": map[string]any{"name": fmt.Sprintf("s-%05d", i)},
			"spec":     map[string]any{"values": values},
		}}
	}}
}

// ShardResult is the shard phase: the CEL-heavy workload converged by one
// replica and by Replicas replicas sharing it (run --sharding). JSON names
// are the benchmark's contract.
type ShardResult struct {
	Triggers int        `json:"triggers"`
	Runs     []ShardRun `json:"runs"`
	// Ratio is the single replica's convergence time over the sharded
	// replicas'.
	Ratio float64 `json:"ratio"`
}

// ShardRun is one configuration's convergence.
type ShardRun struct {
	Replicas int `json:"replicas"`
	// ConvergenceSeconds: processes started → every child created.
	ConvergenceSeconds float64 `json:"convergence_seconds"`
	// JoinedSeconds: processes started → every replica working under the
	// full view (0 for one replica).
	JoinedSeconds float64 `json:"joined_seconds"`
	// Creates are each replica's children created.
	Creates []int `json:"creates"`
	// CPUSeconds: the replicas' CPU time to converge, summed;
	// ControlPlaneCPUSeconds: etcd's and kube-apiserver's over the same
	// time.
	CPUSeconds             float64 `json:"cpu_seconds"`
	ControlPlaneCPUSeconds float64 `json:"control_plane_cpu_seconds"`
	// RSSBytes: the replicas' resident memory at convergence, summed.
	RSSBytes int64 `json:"rss_bytes"`
}

// runShard converges n Score triggers with one replica and with replicas
// replicas of the syncloop binary, each in a namespace of its own with the
// triggers created before the processes start.
func runShard(ctx context.Context, env *testenv.Env, bin string, n, replicas int, logf func(string, ...any)) (*ShardResult, error) {
	dir, err := os.MkdirTemp("", "syncloop-bench-shard-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	crd := filepath.Join(dir, "crd.yaml")
	if err := os.WriteFile(crd, []byte(scoreCRD), 0o644); err != nil {
		return nil, err
	}
	if _, err := env.InstallCRDs(ctx, crd); err != nil {
		return nil, err
	}
	res := &ShardResult{Triggers: n}
	for _, k := range []int{1, replicas} {
		run, err := shardRun(ctx, env, bin, dir, n, k, logf)
		if err != nil {
			return nil, err
		}
		res.Runs = append(res.Runs, *run)
	}
	res.Ratio = res.Runs[0].ConvergenceSeconds / res.Runs[1].ConvergenceSeconds
	return res, nil
}

func shardRun(ctx context.Context, env *testenv.Env, bin, dir string, n, replicas int, logf func(string, ...any)) (*ShardRun, error) {
	cs, dc, err := adminClients(env)
	if err != nil {
		return nil, err
	}
	ns, err := namespace(ctx, cs, "bench-shard-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = cs.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{}) }()
	rulesDir := filepath.Join(dir, ns)
	if err := os.Mkdir(rulesDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(rulesDir, "score.yaml"), []byte(strings.ReplaceAll(scoreRule, "NS", ns)), 0o644); err != nil {
		return nil, err
	}
	w := scoreWorkload()
	start := time.Now()
	if err := w.create(ctx, dc, ns, n); err != nil {
		return nil, err
	}
	logf("shard: %d Scores created in %.1fs", n, time.Since(start).Seconds())

	var procs []*syncloopRun
	defer func() { _ = stopAll(procs) }()
	cpBefore := controlPlaneCPU(env)
	start = time.Now()
	for i := range replicas {
		var extra []string
		if replicas > 1 {
			extra = []string{"--sharding", "--leader-elect-namespace", ns, "--leader-elect-id", "bench",
				"--leader-elect-identity", fmt.Sprintf("replica-%d", i)}
		}
		p, err := startSyncloop(bin, rulesDir, env.Kubeconfig(), filepath.Join(rulesDir, fmt.Sprintf("replica-%d.log", i)), extra...)
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
	}
	run := &ShardRun{Replicas: replicas, Creates: make([]int, replicas)}
	var last []map[string]float64
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		total := 0
		last = last[:0]
		for i, p := range procs {
			if err := p.exited(); err != nil {
				return false, fmt.Errorf("replica %d: %w", i, err)
			}
			m, err := p.scrape(ctx)
			if err != nil {
				return false, nil // not serving yet
			}
			last = append(last, m)
			run.Creates[i] = int(m[`syncloop_apply_total{action="create",rule="score"}`])
			total += run.Creates[i]
		}
		if replicas > 1 && run.JoinedSeconds == 0 {
			joined := true
			for _, m := range last {
				joined = joined && int(m["syncloop_shard_members"]) == replicas
			}
			if joined && len(last) == replicas {
				run.JoinedSeconds = time.Since(start).Seconds()
			}
		}
		return total >= n, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%d replicas converging: %w", replicas, err)
	}
	run.ConvergenceSeconds = time.Since(start).Seconds()
	run.ControlPlaneCPUSeconds = controlPlaneCPU(env) - cpBefore
	for i, p := range procs {
		run.CPUSeconds += last[i]["process_cpu_seconds_total"]
		run.RSSBytes += procKB(p.status(), "VmRSS:") << 10
	}
	children, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "syncloop.dev/rule=score"})
	if err != nil {
		return nil, err
	}
	if len(children.Items) != n {
		return nil, fmt.Errorf("%d replicas: %d children, want %d", replicas, len(children.Items), n)
	}
	logf("shard: %d replica(s) converged %d triggers in %.2fs (joined after %.2fs), creates %v, %.1f CPU seconds (control plane %.1f), RSS %.0f MiB",
		replicas, n, run.ConvergenceSeconds, run.JoinedSeconds, run.Creates, run.CPUSeconds, run.ControlPlaneCPUSeconds, float64(run.RSSBytes)/(1<<20))
	return run, nil
}

// controlPlaneCPU is the CPU time etcd and kube-apiserver have used, in
// seconds (from /proc/<pid>/stat: utime and stime, in clock ticks of
// 1/100 s).
func controlPlaneCPU(env *testenv.Env) float64 {
	total := 0.0
	for name, pid := range env.PIDs() {
		if name == "kube-controller-manager" {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command (which may hold spaces) in parentheses.
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 12 {
			u, _ := strconv.ParseFloat(fields[11], 64)
			k, _ := strconv.ParseFloat(fields[12], 64)
			total += (u + k) / 100
		}
	}
	return total
}

// reportShard is the shard phase's table.
func reportShard(r *ShardResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — sharding, N = %d\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s; kube-apiserver %s. The `syncloop run` binary with its defaults, alone and with `--sharding`, the replicas as processes on the machine that runs etcd and kube-apiserver; %d Score custom resources created before the processes start, each needing one ConfigMap that CEL computes over pairs of its 64 values (about 8,000 iterations a reconcile).\n\n",
		cpuModel(), runtime.NumCPU(), memTotal(), testenv.KubeVersion, r.Triggers)
	b.WriteString("| replicas | convergence: start → all created | all joined | creates per replica | replicas' CPU | etcd + kube-apiserver CPU | replicas' RSS |\n|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		joined := "—"
		if run.JoinedSeconds > 0 {
			joined = fmt.Sprintf("%.2f s", run.JoinedSeconds)
		}
		fmt.Fprintf(&b, "| %d | %.2f s | %s | %s | %.1f s | %.1f s | %.0f MiB |\n", run.Replicas, run.ConvergenceSeconds, joined,
			strings.Trim(fmt.Sprint(run.Creates), "[]"), run.CPUSeconds, run.ControlPlaneCPUSeconds, float64(run.RSSBytes)/(1<<20))
	}
	fmt.Fprintf(&b, "\nRatio, convergence of 1 replica / of %d: %.2f.\n", r.Runs[len(r.Runs)-1].Replicas, r.Ratio)
	return b.String()
}
