package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

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

// ProcessResult is what one run of a controller process on the tenant
// workload measured. JSON names are the benchmark's contract.
type ProcessResult struct {
	// Controller is what converged: "syncloop" or "hand-written".
	Controller string `json:"controller"`
	// Streamed: a client created the Tenants while the controller ran,
	// from its start; otherwise they existed before it started.
	Streamed bool `json:"streamed"`
	// AsServiceAccounts: the controller and the client acted as
	// ServiceAccounts (API Priority and Fairness classifies them; the
	// admin identity is exempt), not as the admin.
	AsServiceAccounts bool `json:"as_service_accounts"`
	Triggers          int  `json:"triggers"`
	// ConvergenceSeconds: process start → every trigger's ConfigMap
	// created.
	ConvergenceSeconds float64 `json:"convergence_seconds"`
	// FirstWriteSeconds: process start → the first ConfigMap created
	// (start-up: discovery, informers listing).
	FirstWriteSeconds float64 `json:"first_write_seconds"`
	// CPUSeconds is the CPU time the process used to converge.
	CPUSeconds float64 `json:"cpu_seconds"`
	// ControlPlaneCPUSeconds is the CPU time etcd and kube-apiserver used
	// from the controller's start to converged: streamed, the client's
	// creates are in it too, as they are for either controller.
	ControlPlaneCPUSeconds float64 `json:"control_plane_cpu_seconds"`
	// GCCycles is how many garbage collections the process ran to
	// converge (go_gc_duration_seconds_count): with Go's default target a
	// smaller live heap is collected more often for the same allocations.
	GCCycles float64 `json:"gc_cycles"`
	// ClientSeconds: the client's N creates of Tenants (32 goroutines)
	// took, and ClientP50Ms, ClientP99Ms the latencies of its requests:
	// streamed, while the controller converged; pre-created, before it
	// started (the client alone).
	ClientSeconds float64 `json:"client_seconds"`
	ClientP50Ms   float64 `json:"client_p50_ms"`
	ClientP99Ms   float64 `json:"client_p99_ms"`
	// LimitSeconds: the same N applies from a plain client-go loop with no
	// client-side limit; ConvergenceRatio is LimitSeconds /
	// ConvergenceSeconds.
	LimitSeconds     float64 `json:"limit_seconds"`
	ConvergenceRatio float64 `json:"convergence_ratio"`
	// Writes: API writes the controller made (POST, PUT, PATCH, DELETE,
	// Events included; not those answered 429 and sent again) from start
	// to converged; WritesPerTrigger is Writes / N, less what a
	// controller writes once per start (in the tenant phase, the revision
	// syncloop records of its rule).
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

// TenantsResult is the tenant workload's phase: the hand-written
// controller and syncloop on the same workload, one after the other on
// the same control plane, with the Tenants created before the controller
// starts and streamed in while it runs (as the admin, and as
// ServiceAccounts).
type TenantsResult struct {
	// Pairs are every round's, each round the three ways in turn.
	Pairs []TenantPair `json:"pairs"`
	// Medians are one pair per way, each measure the median of its
	// rounds' and each ratio the median of the rounds' ratios (a pair ran
	// back to back, so its ratio is the steadier measure); with one round,
	// the rounds' pairs themselves.
	Medians []TenantPair `json:"medians"`
}

// TenantPair is one way of running the workload, with both controllers.
type TenantPair struct {
	HandWritten *ProcessResult `json:"hand_written"`
	Syncloop    *ProcessResult `json:"syncloop"`
	// Ratio is the hand-written controller's convergence over syncloop's
	// (1: as fast); CPURatio syncloop's CPU seconds over the hand-written
	// controller's (1: as frugal).
	Ratio    float64 `json:"ratio"`
	CPURatio float64 `json:"cpu_ratio"`
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
	// Streamed: the client creates the Tenants while the controller runs.
	Streamed bool
	// AsServiceAccounts: the controller and the client act as
	// ServiceAccounts bound to cluster-admin (Kubeconfig is ignored).
	AsServiceAccounts bool
	// Rounds: how many times the phase runs its three ways (0: once); odd
	// rounds swap which controller of a pair runs first.
	Rounds int
}

// tenantController is a controller the tenant workload runs: how its
// process starts and the label selector of its ConfigMaps.
type tenantController struct {
	name     string
	start    func(run TenantRun, kubeconfig, rulesDir, ns, logPath string) (*syncloopRun, error)
	children string
	// startWrites are the writes the controller makes once per start,
	// besides its children: syncloop records its rule's revision.
	startWrites int
}

var (
	syncloopCtl = tenantController{name: "syncloop",
		start: func(run TenantRun, kubeconfig, rulesDir, _, logPath string) (*syncloopRun, error) {
			return startSyncloop(run.Syncloop, rulesDir, kubeconfig, logPath, run.Args...)
		},
		children: "syncloop.dev/rule=tenant-config", startWrites: 1}
	handCtl = tenantController{name: "hand-written",
		start: func(_ TenantRun, kubeconfig, _, ns, logPath string) (*syncloopRun, error) {
			return startHandTenants(kubeconfig, ns, logPath)
		},
		children: handLabel}
)

// runTenants runs the tenant workload's phase on env: the limit once, then
// each way of running it with the hand-written controller and syncloop —
// pre-created (hand-written first), streamed (syncloop first, so that
// neither always runs on the fuller control plane) and streamed as
// ServiceAccounts (hand-written first).
func runTenants(ctx context.Context, env *testenv.Env, run TenantRun, logf func(string, ...any)) (*TenantsResult, error) {
	if err := installTenantCRD(ctx, env); err != nil {
		return nil, err
	}
	var limit float64
	if run.LimitWorkers > 0 {
		d, err := tenantWorkload(tenantRule).limit(ctx, env, run.Triggers, run.LimitWorkers)
		if err != nil {
			return nil, err
		}
		limit = d.Seconds()
		logf("tenants: limit: %d applies from %d goroutines in %.2fs", run.Triggers, run.LimitWorkers, limit)
	}
	res := &TenantsResult{}
	ways := []struct {
		streamed, asSAs, syncloopFirst bool
	}{{false, false, false}, {true, false, true}, {true, true, false}}
	for i := range max(1, run.Rounds) * len(ways) {
		round, way := i/len(ways), ways[i%len(ways)]
		r := run
		r.Streamed, r.AsServiceAccounts, r.LimitWorkers = way.streamed, way.asSAs, 0
		if way.streamed {
			r.Updates, r.Idle = 0, 0
		}
		order := []tenantController{handCtl, syncloopCtl}
		if way.syncloopFirst != (round%2 == 1) {
			order = []tenantController{syncloopCtl, handCtl}
		}
		if run.Rounds > 1 {
			logf("tenants: round %d of %d", round+1, run.Rounds)
		}
		var pair TenantPair
		for _, ctl := range order {
			pr, err := runTenantsWith(ctx, env, r, ctl, logf)
			if err != nil {
				return nil, err
			}
			if limit > 0 {
				pr.LimitSeconds, pr.ConvergenceRatio = limit, limit/pr.ConvergenceSeconds
			}
			if ctl.name == syncloopCtl.name {
				pair.Syncloop = pr
			} else {
				pair.HandWritten = pr
			}
		}
		pair.Ratio = pair.HandWritten.ConvergenceSeconds / pair.Syncloop.ConvergenceSeconds
		pair.CPURatio = pair.Syncloop.CPUSeconds / pair.HandWritten.CPUSeconds
		res.Pairs = append(res.Pairs, pair)
	}
	for w := range ways {
		var rounds []TenantPair
		for i := w; i < len(res.Pairs); i += len(ways) {
			rounds = append(rounds, res.Pairs[i])
		}
		res.Medians = append(res.Medians, medianPair(rounds))
	}
	return res, nil
}

// medianPair is one pair standing for rounds of one way: each measure of
// each controller the median of its rounds', each ratio the median of the
// rounds' ratios.
func medianPair(rounds []TenantPair) TenantPair {
	var hand, sync []*ProcessResult
	var ratio, cpu []float64
	for _, p := range rounds {
		hand, sync = append(hand, p.HandWritten), append(sync, p.Syncloop)
		ratio, cpu = append(ratio, p.Ratio), append(cpu, p.CPURatio)
	}
	return TenantPair{HandWritten: medianResult(hand), Syncloop: medianResult(sync), Ratio: median(ratio), CPURatio: median(cpu)}
}

// medianResult is a ProcessResult whose every number is the median of
// rs's (the rest is rs[0]'s: the way they ran).
func medianResult(rs []*ProcessResult) *ProcessResult {
	out := *rs[0]
	v := reflect.ValueOf(&out).Elem()
	for f := range v.NumField() {
		field := v.Field(f)
		var xs []float64
		for _, r := range rs {
			x := reflect.ValueOf(r).Elem().Field(f)
			switch x.Kind() {
			case reflect.Float64:
				xs = append(xs, x.Float())
			case reflect.Int, reflect.Int64:
				xs = append(xs, float64(x.Int()))
			}
		}
		if len(xs) == 0 {
			continue
		}
		if field.Kind() == reflect.Float64 {
			field.SetFloat(median(xs))
		} else {
			field.SetInt(int64(math.Round(median(xs))))
		}
	}
	return &out
}

// median is the middle of xs (the mean of the two middle ones for an even
// count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

func installTenantCRD(ctx context.Context, env *testenv.Env) error {
	dir, err := os.MkdirTemp("", "syncloop-bench-tenants-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	crd := filepath.Join(dir, "crd.yaml")
	if err := os.WriteFile(crd, []byte(tenantCRD), 0o644); err != nil {
		return err
	}
	_, err = env.InstallCRDs(ctx, crd)
	return err
}

// runTenantsWith runs the tenant workload once on env, whose Tenant CRD is
// installed, with the controller ctl, in a namespace of its own that it
// empties and deletes after.
func runTenantsWith(ctx context.Context, env *testenv.Env, run TenantRun, ctl tenantController, logf func(string, ...any)) (*ProcessResult, error) {
	admin := env.Config()
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "syncloop-bench-tenants-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ns, err := namespace(ctx, cs, "bench-tenants-")
	if err != nil {
		return nil, err
	}
	kubeconfig, client := run.Kubeconfig, admin
	if kubeconfig == "" {
		kubeconfig = env.Kubeconfig()
	}
	if run.AsServiceAccounts {
		if kubeconfig, client, err = serviceAccounts(ctx, env, ns, dir); err != nil {
			return nil, err
		}
	}
	dc, err := k8sdynamic.NewForConfig(client)
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
	res := &ProcessResult{Controller: ctl.name, Streamed: run.Streamed, AsServiceAccounts: run.AsServiceAccounts,
		Triggers: run.Triggers, Updates: run.Updates}
	what := ctl.name
	if run.Streamed {
		what += ", streamed"
	}
	if run.AsServiceAccounts {
		what += ", as ServiceAccounts"
	}
	createTenants := func() error {
		took, p50, p99, err := createTimed(ctx, dc, w, ns, run.Triggers)
		res.ClientSeconds, res.ClientP50Ms, res.ClientP99Ms = took.Seconds(), ms(p50), ms(p99)
		return err
	}
	if !run.Streamed {
		if err := createTenants(); err != nil {
			return nil, err
		}
		logf("tenants (%s): %d Tenants created in %.1fs, p50 %.1f ms, p99 %.1f ms", what, run.Triggers, res.ClientSeconds, res.ClientP50Ms, res.ClientP99Ms)
	}

	// The children are counted as the API server has them, from a watch
	// of this process's: scraping the controller's metrics for progress
	// would cost the measured process CPU at every poll.
	pcs, err := protobufAdmin(env)
	if err != nil {
		return nil, err
	}
	watched, err := watchChildren(ctx, pcs, ns, ctl.children)
	if err != nil {
		return nil, err
	}
	defer watched.stop()
	cpBefore := controlPlaneCPU(env)
	start := time.Now()
	proc, err := ctl.start(run, kubeconfig, rulesDir, ns, filepath.Join(dir, "controller.log"))
	if err != nil {
		return nil, err
	}
	defer proc.stop()
	fail := func(err error) (*ProcessResult, error) {
		_ = proc.stop()
		return nil, fmt.Errorf("tenants (%s): %w; the controller's last output:\n%s", what, err, proc.lastOutput())
	}
	scrape := func() (map[string]float64, error) { return proc.scrape(ctx) }
	streamed := make(chan error, 1)
	if run.Streamed {
		go func() { streamed <- createTenants() }()
	} else {
		streamed <- nil
	}

	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		if err := proc.exited(); err != nil {
			return false, err
		}
		select {
		case err := <-streamed:
			if err != nil {
				return false, fmt.Errorf("the client streaming Tenants: %w", err)
			}
			streamed <- nil
		default:
		}
		n, _, err := watched.count("")
		return n >= run.Triggers, err
	})
	if err != nil {
		return fail(fmt.Errorf("converging: %w", err))
	}
	res.ControlPlaneCPUSeconds = controlPlaneCPU(env) - cpBefore
	status := proc.status()
	res.RSSAtConvergenceBytes = procKB(status, "VmRSS:") << 10
	_, at, _ := watched.count("")
	res.ConvergenceSeconds, res.FirstWriteSeconds = at[1].Sub(start).Seconds(), at[0].Sub(start).Seconds()
	// The last child's watch event can come before the controller has its
	// answer (client-go counts a request once its answer is read): its
	// count of writes is read once it has one per trigger and its start's.
	var m map[string]float64
	want := run.Triggers + ctl.startWrites
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		m, err = scrape()
		return err == nil && writes(m) >= want, nil
	}); err != nil {
		return fail(fmt.Errorf("the controller counted %d writes for %d children and %d at start: %w", writes(m), run.Triggers, ctl.startWrites, err))
	}
	res.CPUSeconds = m["process_cpu_seconds_total"]
	res.GCCycles = m["go_gc_duration_seconds_count"]
	res.Writes = writes(m)
	if u := unusualWrites(m); u != "" {
		logf("tenants (%s): writes answered neither 200 nor 201: %s", what, u)
	}
	res.WritesPerTrigger = float64(res.Writes-ctl.startWrites) / float64(run.Triggers)
	if err := <-streamed; err != nil {
		return fail(err)
	}
	if run.Streamed {
		logf("tenants (%s): the client's %d creates took %.1fs, p50 %.1f ms, p99 %.1f ms", what, run.Triggers, res.ClientSeconds, res.ClientP50Ms, res.ClientP99Ms)
	}
	logf("tenants (%s): converged %d triggers in %.2fs (first write after %.2fs, %.1f CPU seconds, %.0f garbage collections), %d writes (%.3f per trigger), RSS %.0f MiB",
		what, run.Triggers, res.ConvergenceSeconds, res.FirstWriteSeconds, res.CPUSeconds, res.GCCycles, res.Writes, res.WritesPerTrigger, float64(res.RSSAtConvergenceBytes)/(1<<20))

	// Idle: nothing changes, nothing is written.
	time.Sleep(run.Idle) // a measuring period, not a wait for a condition
	idle, err := scrape()
	if err != nil {
		return fail(err)
	}
	res.IdleWrites, res.IdleSeconds = writes(idle)-res.Writes, run.Idle.Seconds()
	res.RSSBytes = procKB(status, "VmRSS:") << 10
	if run.Idle > 0 {
		logf("tenants (%s): %d writes in %.0fs idle; RSS %.0f MiB", what, res.IdleWrites, res.IdleSeconds, float64(res.RSSBytes)/(1<<20))
	}

	// Updates: change run.Updates triggers at once.
	if run.Updates > 0 {
		start = time.Now()
		if err := parallel(ctx, run.Updates, 32, func(ctx context.Context, i int) error {
			_, err := dc.Resource(tenants).Namespace(ns).Patch(ctx, fmt.Sprintf("t-%05d", i), types.MergePatchType,
				[]byte(`{"spec":{"tier":"gold"}}`), metav1.PatchOptions{})
			return err
		}); err != nil {
			return fail(err)
		}
		err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
			n, _, err := watched.count("gold")
			return n >= run.Updates, err
		})
		if err != nil {
			return fail(fmt.Errorf("updating: %w", err))
		}
		_, at, _ := watched.count("gold")
		res.UpdateSeconds = at[1].Sub(start).Seconds()
		// Every child holds the change (as the API server has it).
		for i := range run.Updates {
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, fmt.Sprintf("tenant-t-%05d", i), metav1.GetOptions{})
			if err != nil || cm.Data["tier"] != "gold" {
				return fail(fmt.Errorf("child of t-%05d not updated: %v %v", i, err, cm.Data))
			}
		}
		logf("tenants (%s): %d trigger updates reflected in %.3fs", what, run.Updates, res.UpdateSeconds)
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
	children, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: ctl.children})
	if err != nil {
		return fail(err)
	}
	if len(children.Items) != run.Triggers {
		return fail(fmt.Errorf("%d children, want %d", len(children.Items), run.Triggers))
	}
	for _, c := range children.Items {
		if ref := metav1.GetControllerOf(&c); ref == nil || ref.Kind != "Tenant" || "tenant-"+ref.Name != c.Name {
			return fail(fmt.Errorf("child %s has controller reference %v, want its Tenant", c.Name, ref))
		}
	}
	if err := proc.stop(); err != nil {
		return fail(fmt.Errorf("the controller exited with %v", err))
	}
	// Leave the cluster as found for the runs after this one: the control
	// plane has no namespace controller or garbage collector, so a deleted
	// namespace would keep its objects — and the next run's syncloop,
	// whose rule has the same name, would list these children too.
	if err := dc.Resource(tenants).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return nil, err
	}
	if err := cs.CoreV1().ConfigMaps(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return nil, err
	}
	_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	return res, nil
}

// childWatch counts the children a watch sees, by the tier they hold.
type childWatch struct {
	w    *watchtools.RetryWatcher
	done chan struct{}

	mu    sync.Mutex
	tiers map[string]string // child name → its tier
	// reached[tier] is how many children hold tier, with when the first
	// and the latest came to hold it.
	reached map[string]*tierCount
	err     error
}

type tierCount struct {
	n  int
	at [2]time.Time
}

// watchChildren watches the ConfigMaps selector selects in ns, from now.
func watchChildren(ctx context.Context, cs kubernetes.Interface, ns, selector string) (*childWatch, error) {
	list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	// A watch the server ends (its timeout, a dropped connection) is
	// resumed from the last version seen.
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return cs.CoreV1().ConfigMaps(ns).Watch(ctx, o)
		}})
	if err != nil {
		return nil, err
	}
	c := &childWatch{w: w, done: make(chan struct{}), tiers: map[string]string{}, reached: map[string]*tierCount{}}
	go func() {
		defer close(c.done)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				c.mu.Lock()
				c.err = fmt.Errorf("watching the children: %v", apierrors.FromObject(ev.Object))
				c.mu.Unlock()
				continue
			}
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			c.mu.Lock()
			tier := cm.Data["tier"]
			old, seen := c.tiers[cm.Name]
			if !seen {
				c.reach(anyTier, now)
			}
			if !seen || old != tier {
				c.tiers[cm.Name] = tier
				c.reach(tier, now)
			}
			c.mu.Unlock()
		}
		c.mu.Lock()
		if c.err == nil {
			c.err = errors.New("the watch of the children ended")
		}
		c.mu.Unlock()
	}()
	return c, nil
}

// reach counts one more child holding tier, at now.
func (c *childWatch) reach(tier string, now time.Time) {
	r := c.reached[tier]
	if r == nil {
		r = &tierCount{at: [2]time.Time{now}}
		c.reached[tier] = r
	}
	r.n++
	r.at[1] = now
}

// count is how many children have come to hold tier ("": any, that is how
// many exist), with when the first and the latest did, and the error that
// ended the watch, if it did.
func (c *childWatch) count(tier string) (int, [2]time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if tier == "" {
		tier = anyTier
	}
	if r := c.reached[tier]; r != nil {
		return r.n, r.at, c.err
	}
	return 0, [2]time.Time{}, c.err
}

// anyTier counts every child seen.
const anyTier = "\x00any"

func (c *childWatch) stop() {
	c.mu.Lock()
	c.err = errStopped
	c.mu.Unlock()
	c.w.Stop()
	<-c.done
}

var errStopped = errors.New("stopped")

// createTimed makes the workload's n triggers in ns from 32 goroutines, as
// w.create, and returns how long it took and its requests' p50 and p99
// latencies.
func createTimed(ctx context.Context, dc k8sdynamic.Interface, w workload, ns string, n int) (took, p50, p99 time.Duration, err error) {
	lat := make([]time.Duration, n)
	start := time.Now()
	err = parallel(ctx, n, 32, func(ctx context.Context, i int) error {
		t := time.Now()
		_, err := dc.Resource(w.trigger).Namespace(ns).Create(ctx, w.make(i), metav1.CreateOptions{})
		lat[i] = time.Since(t)
		return err
	})
	took = time.Since(start)
	if err != nil || n == 0 {
		return took, 0, 0, err
	}
	slices.Sort(lat)
	return took, lat[(n-1)/2], lat[(n-1)*99/100], nil
}

// serviceAccounts makes, in ns, the ServiceAccounts the controller and
// the client act as — bound to cluster-admin, so RBAC allows all and API
// Priority and Fairness, which exempts the admin, classifies them as any
// ServiceAccount (the built-in service-accounts flow schema) — and returns
// a kubeconfig file for the controller and the client's config.
func serviceAccounts(ctx context.Context, env *testenv.Env, ns, dir string) (string, *rest.Config, error) {
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return "", nil, err
	}
	var cfgs []*rest.Config
	for _, name := range []string{"controller", "client"} {
		cfg, err := env.ServiceAccountConfig(ctx, ns, name)
		if err != nil {
			return "", nil, err
		}
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			return "", nil, err
		}
		cfgs = append(cfgs, cfg)
	}
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, cfgs[0], "controller"); err != nil {
		return "", nil, err
	}
	return kubeconfig, cfgs[1], nil
}

// writes sums rest_client_requests_total over the writing methods, less
// those the API server's flow control answered 429 (client-go sends them
// again: the server never acted on them, and the controller did not
// decide them).
func writes(m map[string]float64) int {
	n := 0
	for k, v := range writeAnswers(m) {
		if !strings.HasSuffix(k, " 429") {
			n += v
		}
	}
	return n
}

// writeAnswers counts the writes by method and answer: "PATCH 201".
func writeAnswers(m map[string]float64) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if !strings.HasPrefix(k, "rest_client_requests_total{") {
			continue
		}
		for _, method := range []string{"POST", "PUT", "PATCH", "DELETE"} {
			if strings.Contains(k, `method="`+method+`"`) {
				out[method+" "+label(k, "code")] += int(v)
			}
		}
	}
	return out
}

// label is the value of a metric sample's label name: `code="201"` → 201.
func label(sample, name string) string {
	_, after, ok := strings.Cut(sample, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, `"`)
	return v
}

// unusualWrites lists the writes answered other than 200 or 201, sorted:
// what to read when a count of writes is not the one expected.
func unusualWrites(m map[string]float64) string {
	var out []string
	for k, v := range writeAnswers(m) {
		if !strings.HasSuffix(k, " 200") && !strings.HasSuffix(k, " 201") {
			out = append(out, fmt.Sprintf("%s ×%d", k, v))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
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
	if err := installTenantCRD(ctx, env); err != nil {
		return nil, err
	}
	return runTenantsWith(ctx, env, run, syncloopCtl, logf)
}
