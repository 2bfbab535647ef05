// Command bench measures syncloop against the local control plane, in
// process: how long it takes to converge N triggers compared with the
// fastest a plain client-go loop can make the same writes (the limit), and
// what a full resync costs once everything is in sync. It prints a table,
// appends it to bench/RESULTS.md with -record, and prints one JSON object as
// its last line. Its test runs it small in CI and checks only the counts,
// never times.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// Config says what to measure.
type Config struct {
	Triggers int // N
	// QPS and Burst cap syncloop's requests client-side, as --qps and
	// --burst do; QPS 0 is syncloop's default: no cap, flow control only.
	QPS   float32
	Burst int
	// Workers is the rule's workers; 0 is the rule's default.
	Workers int
	// LimitWorkers is how many goroutines the limit loop applies from.
	LimitWorkers int
	// Resync is the rule's resync period; the steady-state phase waits for
	// two. Long enough not to disturb convergence.
	Resync time.Duration
	// Updates is how many trigger updates the latency phase times.
	Updates int
	// Cycles is how many rule add/remove cycles the churn phase makes.
	Cycles int
	// Rules is how many rules the reload phase loads.
	Rules int
	// CPUProfile, when set, is where a CPU profile of the bench process
	// while syncloop converges is written.
	CPUProfile string
	// MemProfile, when set, is where the bench process's allocation
	// profile is written once syncloop has converged, and MemProfile +
	// ".base" the one from just before it started: go tool pprof
	// -diff_base shows what converging allocated.
	MemProfile string
	// Rounds is how many pairs of convergences (the hand-written
	// controller's and syncloop's) the ratios are the medians of; the
	// first is the phase's own.
	Rounds int
	// APIServerProfile, when set, is where a CPU profile of kube-apiserver
	// is written while syncloop converges in process, and APIServerProfile
	// + ".hand" one while the hand-written controller's first run does:
	// each over the same span (1.5 times the limit loop's time), so that
	// their samples compare what each controller cost the API server.
	// The control plane must serve /debug/pprof (--profiling=true).
	APIServerProfile string
}

// startCPUProfile starts a CPU profile written to path + suffix, when
// path is set; stop ends it, once however often it is called.
func startCPUProfile(path, suffix string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path + suffix)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		f.Close()
	}), nil
}

// startServerProfile starts a CPU profile of env's kube-apiserver over
// span, to be written to path + suffix, when path is set; wait waits for
// it and says whether it was written.
func startServerProfile(ctx context.Context, env *testenv.Env, path, suffix string, span time.Duration) (wait func() error) {
	if path == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			cs, err := kubernetes.NewForConfig(env.Config())
			if err != nil {
				return err
			}
			seconds := max(1, int(span.Round(time.Second).Seconds()))
			data, err := cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(seconds)).
				Timeout(span + time.Minute).DoRaw(ctx)
			if err != nil {
				return fmt.Errorf("profiling kube-apiserver (is --profiling on?): %w", err)
			}
			return os.WriteFile(path+suffix, data, 0o644)
		}()
	}()
	return sync.OnceValue(func() error { return <-done })
}

// settle collects the garbage of what ran before in this process, so that
// each controller of the in-process phase starts from the heap a process
// of its own would start from: the one that followed the reload phase's
// or the cache-heap measure's forced collections would otherwise start
// with a small heap goal and pay for collections — and the scavenger's
// returning of the freed memory — that the one that followed the limit
// loop's garbage did not.
func settle() { runtime.GC() }

// selfCPU is the CPU time this process has used, user and system, in
// seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// writeHeapProfile writes the allocation profile as it stands to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // the profile is as of the last GC
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Result is what one run measured. JSON names are the benchmark's contract.
type Result struct {
	Triggers           int     `json:"triggers"`
	ConvergenceSeconds float64 `json:"convergence_seconds"`
	LimitSeconds       float64 `json:"limit_seconds"`
	// ConvergenceRatio is LimitSeconds / ConvergenceSeconds: 1 means
	// syncloop converges as fast as the writes alone can be made.
	ConvergenceRatio float64 `json:"convergence_ratio"`
	// HandWrittenSeconds is the same triggers converged by a hand-written
	// client-go controller for the job (handWritten), from its start: the
	// mean of a run before syncloop's (HandWrittenBeforeSeconds) and one
	// after the phase (HandWrittenAfterSeconds), so that it does not run
	// only on the emptier control plane (on 10,000 triggers the same
	// controller took 6.9 s first and 9.8 s after syncloop in one run,
	// 10.4 and 8.0 s in another). HandWrittenRatio is HandWrittenSeconds /
	// ConvergenceSeconds: 1 means syncloop is as fast as the controller it
	// replaces.
	HandWrittenSeconds       float64 `json:"hand_written_seconds"`
	HandWrittenBeforeSeconds float64 `json:"hand_written_before_seconds"`
	HandWrittenAfterSeconds  float64 `json:"hand_written_after_seconds"`
	HandWrittenRatio         float64 `json:"hand_written_ratio"`
	// CPUSeconds is the CPU time the bench process used while syncloop
	// converged — syncloop's, as nothing else in the process works then —
	// and HandWrittenCPUSeconds the mean of the hand-written controller's
	// two runs, from its start to converged; CPURatio is CPUSeconds /
	// HandWrittenCPUSeconds (1: as frugal).
	CPUSeconds            float64 `json:"cpu_seconds"`
	HandWrittenCPUSeconds float64 `json:"hand_written_cpu_seconds"`
	CPURatio              float64 `json:"cpu_ratio"`
	// Rounds are the convergence and CPU ratios of Config.Rounds pairs:
	// the first the phase's own (the hand-written controller's mean
	// against syncloop), each further one both controllers again on
	// fresh triggers; MedianRatio and MedianCPURatio their medians — on
	// this 2-core machine one controller's runs minutes apart spread by
	// as much as the ratios measure.
	Rounds         []EngineRound `json:"rounds"`
	MedianRatio    float64       `json:"median_ratio"`
	MedianCPURatio float64       `json:"median_cpu_ratio"`
	// FirstWriteSeconds: syncloop's start → its first child applied
	// (discovery, informers listing).
	FirstWriteSeconds float64 `json:"first_write_seconds"`
	// ColdStartRequests counts syncloop's API requests from its start to
	// convergence.
	ColdStartRequests int `json:"cold_start_requests"`
	// SteadyWrites and SteadyReads count API requests during one full
	// resync with everything in sync (watches excluded).
	SteadyWrites int `json:"steady_writes"`
	SteadyReads  int `json:"steady_reads"`
	// Heap in use per cached trigger: syncloop's informer cache as
	// syncloop runs it (protobuf, ConfigMaps typed, managedFields
	// stripped) and a plain dynamic informer's (unstructured, kept).
	HeapBytesPerObject           float64 `json:"heap_bytes_per_object"`
	HeapBytesPerObjectUnstripped float64 `json:"heap_bytes_per_object_unstripped"`
	// Trigger update → child updated, over Config.Updates updates.
	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP90Ms float64 `json:"latency_p90_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	// GoroutinesDelta is the goroutine count after 200 rule add/remove
	// cycles minus before.
	GoroutinesDelta int `json:"goroutines_delta"`
	// InformersDelta is the same for the informers running.
	InformersDelta int `json:"informers_delta"`
	// RSSBytes is the process's resident memory with the engine converged
	// on N triggers.
	RSSBytes int64 `json:"rss_bytes"`
	// ReloadMs is the time from a rule file change, with Config.Rules rules
	// loaded, to the changed rule's new template applied to its child
	// (the watcher's debounce included).
	ReloadMs float64 `json:"reload_ms"`
}

const rule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-child"}
        data: {from: "${object.metadata.name}", value: "${object.data.value}"}
  WORKERS
  resyncPeriod: RESYNC
`

// EngineRound is one pair of in-process convergences: the hand-written
// controller's and syncloop's times and CPU from their starts, and the
// ratios hand-written / syncloop (convergence) and syncloop /
// hand-written (CPU).
type EngineRound struct {
	HandWrittenSeconds    float64 `json:"hand_written_seconds,omitempty"`
	HandWrittenCPUSeconds float64 `json:"hand_written_cpu_seconds,omitempty"`
	Seconds               float64 `json:"seconds,omitempty"`
	CPUSeconds            float64 `json:"cpu_seconds,omitempty"`
	Ratio                 float64 `json:"ratio"`
	CPURatio              float64 `json:"cpu_ratio"`
}

// syncloopConverges runs a fresh engine with the workload's rule, named
// name, over n triggers created in a namespace of its own before it
// starts, until every child is applied; it returns the time and the
// process's CPU from its start, and removes the namespace's objects.
func syncloopConverges(ctx context.Context, env *testenv.Env, cfg Config, w workload, name string) (seconds, cpu float64, err error) {
	admin, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return 0, 0, err
	}
	w.rule = strings.Replace(w.rule, "{name: bench}", "{name: "+name+"}", 1)
	ns, _, set, err := w.prepare(ctx, env, cfg.Triggers, "bench-round-", nil)
	if err != nil {
		return 0, 0, err
	}
	defer func() { err = errors.Join(err, clearNamespace(context.WithoutCancel(ctx), admin, ns)) }()
	eng, m, _, _, err := newEngine(syncloopConfig(env.Config(), cfg), cfg.Triggers)
	if err != nil {
		return 0, 0, err
	}
	settle()
	cpu0 := selfCPU()
	start := time.Now()
	_, stop := runEngine(ctx, eng, set, nil)
	defer stop()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		return m.writes.Load() >= int64(cfg.Triggers), nil
	}); err != nil {
		return 0, 0, fmt.Errorf("syncloop did not converge: %d of %d children applied", m.writes.Load(), cfg.Triggers)
	}
	return time.Unix(0, m.reached.Load()).Sub(start).Seconds(), selfCPU() - cpu0, nil
}

// clearNamespace deletes the ConfigMaps of ns — a round's triggers and
// children — so that the control plane does not grow round by round.
func clearNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	return cs.CoreV1().ConfigMaps(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
}

// Run measures on env. logf reports progress.
func Run(ctx context.Context, env *testenv.Env, cfg Config, logf func(string, ...any)) (*Result, error) {
	admin, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	res := &Result{Triggers: cfg.Triggers}

	resync := cfg.Resync
	workers := ""
	if cfg.Workers > 0 {
		workers = fmt.Sprintf("workers: %d", cfg.Workers)
	}
	w := configMapWorkload(strings.NewReplacer("WORKERS", workers, "RESYNC", resync.String()).Replace(rule))
	limit, err := w.limit(ctx, env, cfg.Triggers, cfg.LimitWorkers)
	if err != nil {
		return nil, err
	}
	res.LimitSeconds = limit.Seconds()
	logf("limit: %d applies from %d goroutines, no client-side limit, in %.2fs", cfg.Triggers, cfg.LimitWorkers, res.LimitSeconds)
	// The profiles of the hand-written controller start with it, once
	// its triggers are created.
	stopHandProfile := func() {}
	var profileErr error
	serverSpan := time.Duration(1.5 * float64(limit))
	waitServerProfile := func() error { return nil }
	var cpu0 float64
	hand, _, err := handWritten(ctx, env, w, cfg.Triggers, handWorkers, func() {
		waitServerProfile = startServerProfile(ctx, env, cfg.APIServerProfile, ".hand", serverSpan)
		if cfg.MemProfile != "" {
			profileErr = writeHeapProfile(cfg.MemProfile + ".hand.base")
		}
		if stop, err := startCPUProfile(cfg.CPUProfile, ".hand"); err == nil {
			stopHandProfile = stop
		} else {
			profileErr = err
		}
		settle()
		cpu0 = selfCPU()
	})
	stopHandProfile()
	handCPU := selfCPU() - cpu0
	if err = errors.Join(err, profileErr, waitServerProfile()); err != nil {
		return nil, err
	}
	if cfg.MemProfile != "" {
		if err := writeHeapProfile(cfg.MemProfile + ".hand"); err != nil {
			return nil, err
		}
	}
	res.HandWrittenBeforeSeconds = hand.Seconds()
	logf("hand-written client-go controller: %d children in %.2fs from its start", cfg.Triggers, res.HandWrittenBeforeSeconds)

	// syncloop: N triggers exist before it starts (cold start).
	ns, err := namespace(ctx, admin, "bench-")
	if err != nil {
		return nil, err
	}
	plain, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	if err := w.create(ctx, plain, ns, cfg.Triggers); err != nil {
		return nil, err
	}
	res.HeapBytesPerObject, res.HeapBytesPerObjectUnstripped, err = cacheHeap(ctx, env.Config(), ns, cfg.Triggers)
	if err != nil {
		return nil, err
	}
	logf("informer cache: %.0f bytes per trigger stripped, %.0f with managedFields", res.HeapBytesPerObject, res.HeapBytesPerObjectUnstripped)
	text := strings.ReplaceAll(w.rule, "NS", ns)
	extraText := strings.NewReplacer("name: bench", "name: bench-extra", "bench-trigger", "bench-extra").Replace(text)
	files, err := parseRules([2]string{"bench.yaml", text}, [2]string{"extra.yaml", extraText})
	if err != nil {
		return nil, err
	}
	set, err := rules.NewSet(files[0])
	if err != nil {
		return nil, err
	}
	var counter testenv.RequestCounter
	eng, m, cl, disco, err := newEngine(counter.Wrap(syncloopConfig(env.Config(), cfg)), cfg.Triggers)
	if err != nil {
		return nil, err
	}
	if cfg.MemProfile != "" {
		if err := writeHeapProfile(cfg.MemProfile + ".base"); err != nil {
			return nil, err
		}
	}
	stopProfile, err := startCPUProfile(cfg.CPUProfile, "")
	if err != nil {
		return nil, err
	}
	defer stopProfile()
	waitServerProfile = startServerProfile(ctx, env, cfg.APIServerProfile, "", serverSpan)
	settle()
	cpu0 = selfCPU()
	start := time.Now()
	engCtx, stop := runEngine(ctx, eng, set, nil)
	defer stop()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Minute, true, func(ctx context.Context) (bool, error) {
		return m.writes.Load() >= int64(cfg.Triggers), nil
	})
	if err != nil {
		return nil, fmt.Errorf("syncloop did not converge: %d of %d children applied", m.writes.Load(), cfg.Triggers)
	}
	res.CPUSeconds = selfCPU() - cpu0
	stopProfile()
	if err := waitServerProfile(); err != nil {
		return nil, err
	}
	if cfg.MemProfile != "" {
		if err := writeHeapProfile(cfg.MemProfile); err != nil {
			return nil, err
		}
	}
	res.ConvergenceSeconds = time.Unix(0, m.reached.Load()).Sub(start).Seconds()
	res.FirstWriteSeconds = time.Unix(0, m.first.Load()).Sub(start).Seconds()
	res.ColdStartRequests = len(counter.Requests(nil))
	res.ConvergenceRatio = res.LimitSeconds / res.ConvergenceSeconds
	res.RSSBytes = rss()
	logf("syncloop: %d children in %.2fs, the first after %.2fs (%d requests)", cfg.Triggers, res.ConvergenceSeconds, res.FirstWriteSeconds, res.ColdStartRequests)

	// Steady state: one full resync with nothing to do. The echoes of our
	// own applies reconcile first; then count over a resync's reconciles.
	quiet := func() error {
		r0 := m.reconciles.Load()
		return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*resync+time.Minute, true, func(context.Context) (bool, error) {
			return m.reconciles.Load() >= r0+int64(cfg.Triggers), nil
		})
	}
	if err := quiet(); err != nil {
		return nil, fmt.Errorf("waiting for a resync: %w", err)
	}
	counter.Reset()
	if err := quiet(); err != nil {
		return nil, fmt.Errorf("waiting for a resync: %w", err)
	}
	for _, r := range counter.Requests(nil) {
		switch {
		case r.IsWrite():
			res.SteadyWrites++
		case !r.Watch:
			res.SteadyReads++
		}
	}
	logf("steady state: one resync of %d triggers: %d writes, %d reads", cfg.Triggers, res.SteadyWrites, res.SteadyReads)

	p50, p90, p99, err := latency(ctx, admin, ns, cfg.Triggers, cfg.Updates)
	if err != nil {
		return nil, err
	}
	res.LatencyP50Ms, res.LatencyP90Ms, res.LatencyP99Ms = ms(p50), ms(p90), ms(p99)
	logf("latency over %d updates: p50 %.1fms p90 %.1fms p99 %.1fms", cfg.Updates, res.LatencyP50Ms, res.LatencyP90Ms, res.LatencyP99Ms)

	both, err := rules.NewSet(files...)
	if err != nil {
		return nil, err
	}
	informers := eng.Informers()
	if res.GoroutinesDelta, err = churn(engCtx, eng, set, both, cfg.Cycles); err != nil {
		return nil, err
	}
	res.InformersDelta = eng.Informers() - informers
	logf("%d rule add/remove cycles: goroutines %+d, informers %+d", cfg.Cycles, res.GoroutinesDelta, res.InformersDelta)

	reloaded, err := reloadTime(ctx, cl, dynamic.NewMapper(disco, 0), admin, ns, cfg.Rules)
	if err != nil {
		return nil, err
	}
	res.ReloadMs = ms(reloaded)
	logf("reload with %d rules loaded: %.0fms from the file change to the new template applied", cfg.Rules, res.ReloadMs)

	// The hand-written controller again, syncloop stopped, on the control
	// plane as the phase left it.
	stop()
	if hand, _, err = handWritten(ctx, env, w, cfg.Triggers, handWorkers, func() { settle(); cpu0 = selfCPU() }); err != nil {
		return nil, err
	}
	res.HandWrittenCPUSeconds = (handCPU + selfCPU() - cpu0) / 2
	res.CPURatio = res.CPUSeconds / res.HandWrittenCPUSeconds
	res.HandWrittenAfterSeconds = hand.Seconds()
	res.HandWrittenSeconds = (res.HandWrittenBeforeSeconds + res.HandWrittenAfterSeconds) / 2
	res.HandWrittenRatio = res.HandWrittenSeconds / res.ConvergenceSeconds
	logf("hand-written client-go controller, after the phase: %d children in %.2fs from its start", cfg.Triggers, res.HandWrittenAfterSeconds)

	// More rounds of the two controllers alone, each on triggers of its
	// own in a fresh namespace, removed after; even rounds run syncloop
	// first.
	res.Rounds = []EngineRound{{Ratio: res.HandWrittenRatio, CPURatio: res.CPURatio}}
	for round := 2; round <= cfg.Rounds; round++ {
		var r EngineRound
		handRun := func() error {
			var cpu0 float64
			took, handNS, err := handWritten(ctx, env, w, cfg.Triggers, handWorkers, func() { settle(); cpu0 = selfCPU() })
			if err != nil {
				return err
			}
			r.HandWrittenSeconds, r.HandWrittenCPUSeconds = took.Seconds(), selfCPU()-cpu0
			return clearNamespace(ctx, admin, handNS)
		}
		syncloopRun := func() (err error) {
			r.Seconds, r.CPUSeconds, err = syncloopConverges(ctx, env, cfg, w, fmt.Sprintf("bench-r%d", round))
			return err
		}
		first, second := handRun, syncloopRun
		if round%2 == 0 {
			first, second = syncloopRun, handRun
		}
		err := first()
		if err == nil {
			err = second()
		}
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", round, err)
		}
		r.Ratio, r.CPURatio = r.HandWrittenSeconds/r.Seconds, r.CPUSeconds/r.HandWrittenCPUSeconds
		logf("round %d: hand-written %.2fs, %.2f CPU s; syncloop %.2fs, %.2f CPU s", round, r.HandWrittenSeconds, r.HandWrittenCPUSeconds, r.Seconds, r.CPUSeconds)
		res.Rounds = append(res.Rounds, r)
	}
	var ratios, cpuRatios []float64
	for _, r := range res.Rounds {
		ratios, cpuRatios = append(ratios, r.Ratio), append(cpuRatios, r.CPURatio)
	}
	res.MedianRatio, res.MedianCPURatio = median(ratios), median(cpuRatios)
	return res, nil
}

// handWorkers are the hand-written controller's workers: syncloop's
// default for a rule.
const handWorkers = rules.DefaultWorkers

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// newEngine makes an engine on cfg whose metrics count writes, recording
// the time of the target-th.
func newEngine(cfg *rest.Config, target int) (*engine.Engine, *counts, *dynamic.Client, *discovery.DiscoveryClient, error) {
	return newFleetEngine(cfg, target, nil)
}

// newFleetEngine is newEngine with the cluster inventory fl (nil: none).
func newFleetEngine(cfg *rest.Config, target int, fl engine.Fleet) (*engine.Engine, *counts, *dynamic.Client, *discovery.DiscoveryClient, error) {
	cl, err := dynamic.NewClient(cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	m := &counts{}
	m.target.Store(int64(target))
	return engine.New(engine.Options{Client: cl, Mapper: dynamic.NewMapper(disco, 0), Metrics: m, Fleet: fl}), m, cl, disco, nil
}

// runEngine runs eng with set, and then each set of updates (nil: none),
// until stop, which waits for it to end; the context returned is the
// engine's.
func runEngine(ctx context.Context, eng *engine.Engine, set *rules.Set, updates <-chan *rules.Set) (context.Context, func()) {
	engCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = eng.Run(engCtx, set, updates)
	}()
	return engCtx, func() { cancel(); <-done }
}

// counts implements engine.Metrics for the benchmark.
type counts struct {
	reconciles atomic.Int64
	writes     atomic.Int64 // creates and updates
	first      atomic.Int64 // UnixNano of the first write
	target     atomic.Int64 // the write whose time reached records
	reached    atomic.Int64 // UnixNano of the target-th write
}

func (c *counts) ReconcileDone(string, string, time.Duration)                  { c.reconciles.Add(1) }
func (c *counts) WatchError(string, string)                                    {}
func (c *counts) RuleRemoved(string)                                           {}
func (c *counts) Panicked(string, string)                                      {}
func (c *counts) DriftRepaired(string, string)                                 {}
func (c *counts) Watching(string)                                              {}
func (c *counts) FunctionCalled(string, string, string, string, time.Duration) {}
func (c *counts) Write(_, action string) {
	if action == "create" || action == "update" {
		n := c.writes.Add(1)
		now := time.Now().UnixNano()
		c.first.CompareAndSwap(0, now)
		if n == c.target.Load() {
			c.reached.Store(now)
		}
	}
}

// syncloopConfig is cfg as `syncloop run` sets its client up: behind flow
// control, asking for uncompressed answers, and with no client-side rate
// limit unless c sets one.
func syncloopConfig(cfg *rest.Config, c Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.DisableCompression = true // as `syncloop run` has it without --api-compression
	if c.QPS > 0 {
		cfg.QPS, cfg.Burst = c.QPS, c.Burst
	}
	cfg.Wrap(dynamic.NewFlowControl(nil).Wrap)
	return cfg
}

// adminClients are a typed and a dynamic client acting as env's admin.
func adminClients(env *testenv.Env) (kubernetes.Interface, k8sdynamic.Interface, error) {
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, nil, err
	}
	dc, err := k8sdynamic.NewForConfig(env.Config())
	return cs, dc, err
}

// protobufAdmin is a typed client acting as env's admin in protobuf, the
// cheapest way to watch many built-in objects.
func protobufAdmin(env *testenv.Env) (kubernetes.Interface, error) {
	cfg := env.Config()
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfig(cfg)
}

func namespace(ctx context.Context, cs kubernetes.Interface, prefix string) (string, error) {
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return ns.Name, nil
}

// configMapWorkload: ConfigMaps labelled bench-trigger, each with a value
// its child copies.
func configMapWorkload(rule string) workload {
	return workload{rule: rule, trigger: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		make: func(i int) *unstructured.Unstructured {
			return &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": fmt.Sprintf("t-%05d", i), "labels": map[string]any{"bench-trigger": "1"}},
				"data":     map[string]any{"value": "v"},
			}}
		}}
}

// parallel calls do for 0..n-1 from workers goroutines (at least one),
// stopping at the first error.
func parallel(ctx context.Context, n, workers int, do func(context.Context, int) error) error {
	workers = max(1, workers)
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
loop:
	for i := range n {
		select {
		case next <- i:
		case err = <-errs:
			break loop
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}
