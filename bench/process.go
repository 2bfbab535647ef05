package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// The tenant workload: N custom resources of a Tenant CRD in one namespace,
// each needing one ConfigMap — syncloop run as a user runs it, the binary
// with its default settings.
const tenantCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: tenants.bench.syncloop.dev}
spec:
  group: bench.syncloop.dev
  scope: Namespaced
  names: {plural: tenants, singular: tenant, kind: Tenant, listKind: TenantList}
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
                tier: {type: string}
`

const tenantRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: tenant-config}
spec:
  watch: {apiVersion: bench.syncloop.dev/v1, kind: Tenant, namespace: NS}
  resources:
    - id: config
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "tenant-${object.metadata.name}"}
        data: {tier: "${object.spec.tier}"}
`

var tenants = schema.GroupVersionResource{Group: "bench.syncloop.dev", Version: "v1", Resource: "tenants"}

// tenantWorkload: Tenants with a tier, each needing a ConfigMap.
func tenantWorkload(rule string) workload {
	return workload{rule: rule, trigger: tenants, make: func(i int) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "bench.syncloop.dev/v1", "kind": "Tenant",
			"metadata": map[string]any{"name": fmt.Sprintf("t-%05d", i)},
			"spec":     map[string]any{"tier": "bronze"},
		}}
	}}
}

// ProcessResult is what one run of the syncloop binary on the tenant
// workload measured. JSON names are the benchmark's contract.
type ProcessResult struct {
	Triggers int `json:"triggers"`
	// ConvergenceSeconds: process start → every trigger's ConfigMap
	// created.
	ConvergenceSeconds float64 `json:"convergence_seconds"`
	// FirstWriteSeconds: process start → the first ConfigMap created
	// (start-up: discovery, informers listing).
	FirstWriteSeconds float64 `json:"first_write_seconds"`
	// CPUSeconds is the CPU time the process used to converge.
	CPUSeconds float64 `json:"cpu_seconds"`
	// LimitSeconds: the same N applies from a plain client-go loop with no
	// client-side limit; ConvergenceRatio is LimitSeconds /
	// ConvergenceSeconds.
	LimitSeconds     float64 `json:"limit_seconds"`
	ConvergenceRatio float64 `json:"convergence_ratio"`
	// Writes: API writes syncloop made (POST, PUT, PATCH, DELETE, Events
	// included) from start to converged; WritesPerTrigger is Writes / N.
	Writes           int     `json:"writes"`
	WritesPerTrigger float64 `json:"writes_per_trigger"`
	// RSSBytes is the process's resident memory converged, after the idle
	// period; RSSAtConvergenceBytes at the moment the last child was
	// applied; PeakRSSBytes its high-water mark over the run.
	RSSBytes              int64 `json:"rss_bytes"`
	RSSAtConvergenceBytes int64 `json:"rss_at_convergence_bytes"`
	PeakRSSBytes          int64 `json:"peak_rss_bytes"`
	// UpdateSeconds: Updates triggers changed at once → every child
	// updated.
	Updates       int     `json:"updates"`
	UpdateSeconds float64 `json:"update_seconds"`
	// IdleWrites are writes over IdleSeconds after converging.
	IdleWrites  int     `json:"idle_writes"`
	IdleSeconds float64 `json:"idle_seconds"`
	// TooManyRequests: 429s the API server answered (the flow control's
	// count); FailedEvents: Failed Events on triggers.
	TooManyRequests int `json:"too_many_requests"`
	FailedEvents    int `json:"failed_events"`
}

// TenantRun says how to run the tenant workload.
type TenantRun struct {
	Syncloop   string   // the binary
	Args       []string // extra `syncloop run` flags (none: the defaults)
	Triggers   int
	Updates    int
	Idle       time.Duration
	Kubeconfig string // syncloop's identity; empty: the admin's
	// Workers sets the rule's workers; 0 leaves the rule's default.
	Workers int
	// LimitWorkers is the limit loop's goroutines; 0 skips the limit.
	LimitWorkers int
}

// runTenants runs the tenant workload on env with the syncloop binary.
func runTenants(ctx context.Context, env *testenv.Env, run TenantRun, logf func(string, ...any)) (*ProcessResult, error) {
	admin := env.Config()
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	dc, err := k8sdynamic.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "syncloop-bench-tenants-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	crd := filepath.Join(dir, "crd.yaml")
	if err := os.WriteFile(crd, []byte(tenantCRD), 0o644); err != nil {
		return nil, err
	}
	if _, err := env.InstallCRDs(ctx, crd); err != nil {
		return nil, err
	}
	ns, err := namespace(ctx, cs, "bench-tenants-")
	if err != nil {
		return nil, err
	}
	rulesDir := filepath.Join(dir, "rules")
	if err := os.Mkdir(rulesDir, 0o755); err != nil {
		return nil, err
	}
	rule := tenantRule
	if run.Workers > 0 {
		rule += fmt.Sprintf("  workers: %d\n", run.Workers)
	}
	w := tenantWorkload(rule)
	if err := os.WriteFile(filepath.Join(rulesDir, "tenant.yaml"), []byte(strings.ReplaceAll(rule, "NS", ns)), 0o644); err != nil {
		return nil, err
	}
	res := &ProcessResult{Triggers: run.Triggers, Updates: run.Updates}
	if run.LimitWorkers > 0 {
		limit, err := w.limit(ctx, env, run.Triggers, run.LimitWorkers)
		if err != nil {
			return nil, err
		}
		res.LimitSeconds = limit.Seconds()
		logf("tenants: limit: %d applies from %d goroutines in %.2fs", run.Triggers, run.LimitWorkers, res.LimitSeconds)
	}
	start := time.Now()
	if err := w.create(ctx, dc, ns, run.Triggers); err != nil {
		return nil, err
	}
	logf("tenants: %d Tenants created in %.1fs", run.Triggers, time.Since(start).Seconds())

	kubeconfig := run.Kubeconfig
	if kubeconfig == "" {
		kubeconfig = env.Kubeconfig()
	}
	start = time.Now()
	proc, err := startSyncloop(run.Syncloop, rulesDir, kubeconfig, filepath.Join(dir, "syncloop.log"), run.Args...)
	if err != nil {
		return nil, err
	}
	defer proc.stop()
	fail := func(err error) (*ProcessResult, error) {
		_ = proc.stop()
		return nil, fmt.Errorf("%w; syncloop's last output:\n%s", err, proc.lastOutput())
	}
	scrape := func() (map[string]float64, error) { return proc.scrape(ctx) }

	var m map[string]float64
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		if err := proc.exited(); err != nil {
			return false, err
		}
		if m, err = scrape(); err != nil {
			return false, nil // not serving yet
		}
		if res.FirstWriteSeconds == 0 && m[`syncloop_apply_total{action="create",rule="tenant-config"}`] > 0 {
			res.FirstWriteSeconds = time.Since(start).Seconds()
		}
		return int(m[`syncloop_apply_total{action="create",rule="tenant-config"}`]) >= run.Triggers, nil
	})
	if err != nil {
		return fail(fmt.Errorf("converging: %w", err))
	}
	res.ConvergenceSeconds = time.Since(start).Seconds()
	if res.LimitSeconds > 0 {
		res.ConvergenceRatio = res.LimitSeconds / res.ConvergenceSeconds
	}
	status := proc.status()
	res.RSSAtConvergenceBytes = procKB(status, "VmRSS:") << 10
	res.CPUSeconds = m["process_cpu_seconds_total"]
	res.Writes = writes(m)
	res.WritesPerTrigger = float64(res.Writes) / float64(run.Triggers)
	logf("tenants: syncloop converged %d triggers in %.2fs (first write after %.2fs, %.1f CPU seconds), %d writes (%.3f per trigger), RSS %.0f MiB",
		run.Triggers, res.ConvergenceSeconds, res.FirstWriteSeconds, res.CPUSeconds, res.Writes, res.WritesPerTrigger, float64(res.RSSAtConvergenceBytes)/(1<<20))

	// Idle: nothing changes, nothing is written.
	time.Sleep(run.Idle) // a measuring period, not a wait for a condition
	idle, err := scrape()
	if err != nil {
		return fail(err)
	}
	res.IdleWrites, res.IdleSeconds = writes(idle)-res.Writes, run.Idle.Seconds()
	res.RSSBytes = procKB(status, "VmRSS:") << 10
	logf("tenants: %d writes in %.0fs idle; RSS %.0f MiB", res.IdleWrites, res.IdleSeconds, float64(res.RSSBytes)/(1<<20))

	// Updates: change run.Updates triggers at once.
	if run.Updates > 0 {
		base := idle[`syncloop_apply_total{action="update",rule="tenant-config"}`]
		start = time.Now()
		if err := parallel(ctx, run.Updates, 32, func(ctx context.Context, i int) error {
			_, err := dc.Resource(tenants).Namespace(ns).Patch(ctx, fmt.Sprintf("t-%05d", i), types.MergePatchType,
				[]byte(`{"spec":{"tier":"gold"}}`), metav1.PatchOptions{})
			return err
		}); err != nil {
			return fail(err)
		}
		err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
			m, err := scrape()
			return err == nil && m[`syncloop_apply_total{action="update",rule="tenant-config"}`]-base >= float64(run.Updates), nil
		})
		if err != nil {
			return fail(fmt.Errorf("updating: %w", err))
		}
		res.UpdateSeconds = time.Since(start).Seconds()
		// Every child holds the change (the metric counts applies).
		for i := range run.Updates {
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, fmt.Sprintf("tenant-t-%05d", i), metav1.GetOptions{})
			if err != nil || cm.Data["tier"] != "gold" {
				return fail(fmt.Errorf("child of t-%05d not updated: %v %v", i, err, cm.Data))
			}
		}
		logf("tenants: %d trigger updates reflected in %.3fs", run.Updates, res.UpdateSeconds)
	}
	if m, err = scrape(); err != nil {
		return fail(err)
	}
	res.TooManyRequests = int(m["syncloop_api_too_many_requests_total"])
	res.PeakRSSBytes = procKB(status, "VmHWM:") << 10
	events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=Failed"})
	if err != nil {
		return fail(err)
	}
	res.FailedEvents = len(events.Items)
	children, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "syncloop.dev/rule=tenant-config"})
	if err != nil {
		return fail(err)
	}
	if len(children.Items) != run.Triggers {
		return fail(fmt.Errorf("%d children, want %d", len(children.Items), run.Triggers))
	}
	if err := proc.stop(); err != nil {
		return fail(fmt.Errorf("syncloop exited with %v", err))
	}
	// Leave the cluster as found for the phases after this one.
	_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	return res, nil
}

// writes sums rest_client_requests_total over the writing methods.
func writes(m map[string]float64) int {
	n := 0.0
	for k, v := range m {
		if !strings.HasPrefix(k, "rest_client_requests_total{") {
			continue
		}
		for _, method := range []string{"POST", "PUT", "PATCH", "DELETE"} {
			if strings.Contains(k, `method="`+method+`"`) {
				n += v
			}
		}
	}
	return int(n)
}

// scrapeClient asks for uncompressed pages: gzip would cost the measured
// process CPU at every scrape.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableCompression: true}}

// scrapeMetrics reads a Prometheus text page into series → value, the
// series written as the page writes them (labels sorted by name).
func scrapeMetrics(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runPushback runs the tenant workload on a control plane of its own whose
// API Priority and Fairness serves syncloop's ServiceAccount one request at
// a time and rejects the rest (testenv.OneSeat).
func runPushback(ctx context.Context, run TenantRun, logf func(string, ...any)) (*ProcessResult, error) {
	env, err := testenv.Start(ctx, testenv.Options{APIServerArgs: testenv.TightAPIServerArgs})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	ns, err := namespace(ctx, cs, "syncloop-system-")
	if err != nil {
		return nil, err
	}
	sa, err := env.OneSeat(ctx, ns, "syncloop")
	if err != nil {
		return nil, err
	}
	run.Kubeconfig = filepath.Join(env.Dir(), "syncloop.kubeconfig")
	if err := testenv.WriteKubeconfig(run.Kubeconfig, sa, "syncloop"); err != nil {
		return nil, err
	}
	logf("pushback: syncloop runs as ServiceAccount %s/syncloop, one seat, 429 beyond", ns)
	return runTenants(ctx, env, run, logf)
}
