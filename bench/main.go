package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

func main() {
	if os.Getenv(handTenantsEnv) != "" {
		os.Exit(handTenantsMain(os.Args[1:]))
	}
	var cfg Config
	flag.IntVar(&cfg.Triggers, "n", 1000, "triggers, each needing one child")
	qps := flag.Float64("qps", 0, "a client-side cap on syncloop's requests per second, as --qps (0: syncloop's default, none)")
	flag.IntVar(&cfg.Burst, "burst", 0, "with -qps, the burst")
	flag.IntVar(&cfg.Rounds, "engine-rounds", 1, "pairs of in-process convergences (hand-written, syncloop) whose ratios' medians are reported; the first is the phase's own, each further one on fresh triggers, even ones syncloop first")
	flag.IntVar(&cfg.Workers, "workers", 0, "the rule's workers (0: the rule's default)")
	flag.IntVar(&cfg.LimitWorkers, "limit-workers", 64, "goroutines of the limit loop (no client-side limit)")
	flag.DurationVar(&cfg.Resync, "resync", 30*time.Second, "the rule's resync period (the steady-state phase waits for two)")
	flag.IntVar(&cfg.Updates, "updates", 200, "trigger updates the latency phase times")
	flag.IntVar(&cfg.Cycles, "cycles", 200, "rule add/remove cycles the churn phase makes")
	flag.IntVar(&cfg.Rules, "rules", 100, "rules the reload phase loads")
	record := flag.String("record", "", "append the results to this Markdown file (e.g. bench/RESULTS.md)")
	flag.StringVar(&cfg.CPUProfile, "cpuprofile", "", "write a CPU profile of syncloop converging in process to this file, and one of the hand-written controller before it to this file + .hand")
	flag.StringVar(&cfg.MemProfile, "memprofile", "", "write the allocation profile of the bench process to this file once syncloop has converged in process, and this file + .base from just before it starts")
	flag.StringVar(&cfg.APIServerProfile, "apiserver-cpuprofile", "", "write a CPU profile of kube-apiserver while syncloop converges in process to this file, and one while the hand-written controller does to this file + .hand (turns the API server's profiling on)")
	note := flag.String("note", "", "a line recorded before the tables (what was measured, e.g. which build)")
	var tr TenantRun
	flag.StringVar(&tr.Syncloop, "syncloop", "", "the syncloop binary, for the tenant workload (e.g. bin/syncloop)")
	flag.IntVar(&tr.Triggers, "tenants", 0, "run the tenant workload with this many Tenants (needs -syncloop; 0: skip)")
	flag.IntVar(&tr.Updates, "tenant-updates", 100, "Tenants the tenant workload changes at once")
	flag.DurationVar(&tr.Idle, "idle", 10*time.Second, "how long the tenant workload counts writes while nothing changes")
	flag.IntVar(&tr.Rounds, "tenant-rounds", 1, "how many times the tenant workload runs its three ways (the report gives each way's medians)")
	flag.IntVar(&tr.Workers, "tenant-workers", 0, "the tenant rule's workers (0: the rule's default)")
	pushback := flag.Int("pushback", 0, "run the tenant workload with this many Tenants as a ServiceAccount that API Priority and Fairness serves one request at a time, rejecting the rest with 429 (needs -syncloop; 0: skip)")
	fanout := flag.Int("fanout", 0, "run the fan-out phase: one lookup source read by this many triggers is changed (0: skip)")
	rollout := flag.Int("rollout", 0, "run the rollout phase: one change of a rule over this many triggers, Immediate and Progressive (0: skip)")
	identities := flag.Int("identities", 0, "run the identity phase: this many rules over the same triggers, acting as one ServiceAccount, then each as its own (0: skip)")
	identityTriggers := flag.Int("identity-triggers", 1000, "the identity phase's triggers")
	function := flag.Int("function", 0, "run the function phase: this many triggers whose child comes from a template, a served WebAssembly function and one started per call (0: skip)")
	chain := flag.Int("chain", 0, "run the chain phase: this many triggers each need three dependent children (0: skip)")
	shard := flag.Int("shard", 0, "run the sharding phase: this many CEL-heavy triggers converged by one replica and by -shard-replicas replicas sharing them (needs -syncloop; 0: skip)")
	shardReplicas := flag.Int("shard-replicas", 3, "replicas of the sharding and memory phases' sharded runs")
	memory := flag.Int("memory", 0, "run the memory phase on a control plane of its own: this many Tenants converged by the hand-written controller, by syncloop and by -shard-replicas replicas sharing them, each process's memory recorded (needs -syncloop; 0: skip)")
	conversion := flag.Int("conversion", 0, "run the conversion phase: this many objects of a kind of two versions, listed and written in each (0: skip)")
	conversionWrites := flag.Int("conversion-writes", 1000, "the conversion phase's writes in each version")
	fleetTriggers := flag.Int("fleet", 0, "run the fleet phase: this many triggers, each with a child in every one of -fleet-clusters workload clusters, control planes of their own (0: skip)")
	fleetClusters := flag.Int("fleet-clusters", 5, "the fleet phase's workload clusters")
	syncloopArgs := flag.String("syncloop-args", "", "extra `syncloop run` flags for the tenant workload, space-separated (none: its defaults)")
	flag.Parse()
	if cfg.MemProfile != "" {
		runtime.MemProfileRate = 4096 // a sample every 4 KiB: a reconcile allocates tens of KiB
	}
	cfg.QPS = float32(*qps)
	if *syncloopArgs != "" {
		tr.Args = strings.Fields(*syncloopArgs)
	}
	tr.LimitWorkers = cfg.LimitWorkers
	if (tr.Triggers > 0 || *pushback > 0 || *shard > 0 || *memory > 0) && tr.Syncloop == "" {
		fmt.Fprintln(os.Stderr, "bench: -tenants, -pushback, -shard and -memory need -syncloop")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) }
	var envOpts testenv.Options
	if cfg.APIServerProfile != "" {
		envOpts.APIServerArgs = []string{"--profiling=true"}
	}
	env, err := testenv.Start(ctx, envOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	var table string
	out := map[string]any{}
	// phase runs one workload on the control plane and records its table
	// under its JSON key; a failure ends the benchmark.
	phase := func(key string, run func() (string, any, error)) {
		t, res, err := run()
		if err != nil {
			env.Stop()
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		table += withNote(t, *note) + "\n"
		out[key] = res
	}
	if cfg.Triggers > 0 {
		phase("engine", func() (string, any, error) {
			res, err := Run(ctx, env, cfg, logf)
			if err != nil {
				return "", nil, err
			}
			return report(cfg, res), res, nil
		})
	}
	if *fanout > 0 {
		phase("fanout", func() (string, any, error) {
			res, err := runFanout(ctx, env, *fanout, cfg.LimitWorkers, logf)
			if err != nil {
				return "", nil, err
			}
			return reportFanout(res, cfg.LimitWorkers), res, nil
		})
	}
	if *rollout > 0 {
		phase("rollout", func() (string, any, error) {
			res, err := runRollout(ctx, env, *rollout, logf)
			if err != nil {
				return "", nil, err
			}
			return reportRollout(res), res, nil
		})
	}
	if *identities > 0 {
		phase("identities", func() (string, any, error) {
			res, err := runIdentities(ctx, env, *identities, *identityTriggers, logf)
			if err != nil {
				return "", nil, err
			}
			return reportIdentities(res), res, nil
		})
	}
	if *fleetTriggers > 0 {
		phase("fleet", func() (string, any, error) {
			res, err := runFleet(ctx, env, *fleetTriggers, *fleetClusters, logf)
			if err != nil {
				return "", nil, err
			}
			return reportFleet(res), res, nil
		})
	}
	if *conversion > 0 {
		phase("conversion", func() (string, any, error) {
			res, err := runConversion(ctx, env, *conversion, *conversionWrites, logf)
			if err != nil {
				return "", nil, err
			}
			return reportConversion(res), res, nil
		})
	}
	if *function > 0 {
		phase("function", func() (string, any, error) {
			res, err := runFunction(ctx, env, *function, logf)
			if err != nil {
				return "", nil, err
			}
			return reportFunction(res), res, nil
		})
	}
	if *chain > 0 {
		phase("chain", func() (string, any, error) {
			res, err := runChain(ctx, env, *chain, cfg.LimitWorkers, logf)
			if err != nil {
				return "", nil, err
			}
			return reportChain(res, cfg.LimitWorkers), res, nil
		})
	}
	if tr.Triggers > 0 {
		phase("tenants", func() (string, any, error) {
			res, err := runTenants(ctx, env, tr, logf)
			if err != nil {
				return "", nil, err
			}
			return reportTenants(tr, res), res, nil
		})
	}
	if *shard > 0 {
		phase("shard", func() (string, any, error) {
			res, err := runShard(ctx, env, tr.Syncloop, *shard, *shardReplicas, logf)
			if err != nil {
				return "", nil, err
			}
			return reportShard(res), res, nil
		})
	}
	env.Stop()
	if *pushback > 0 {
		run := tr
		run.Triggers, run.LimitWorkers = *pushback, 0
		res, err := runPushback(ctx, run, logf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		table += withNote(reportPushback(run, res), *note) + "\n"
		out["pushback"] = res
	}
	if *memory > 0 {
		res, err := func() (*MemoryResult, error) {
			env, err := testenv.Start(ctx, testenv.Options{})
			if err != nil {
				return nil, err
			}
			defer env.Stop()
			return runMemory(ctx, env, tr.Syncloop, *memory, *shardReplicas, tr.Idle, logf)
		}()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		table += withNote(reportMemory(res), *note) + "\n"
		out["memory"] = res
	}
	fmt.Print(table)
	if *record != "" {
		f, err := os.OpenFile(*record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = io.WriteString(f, table)
			f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}

// report is the Markdown table of a run, with the machine it ran on.
func report(cfg Config, r *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — N = %d\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	settings := "syncloop's defaults (no client-side limit, flow control, the rule's default workers)"
	if cfg.QPS > 0 || cfg.Workers > 0 {
		settings = fmt.Sprintf("syncloop with client QPS %.0f, burst %d, %d workers (0: defaults)", cfg.QPS, cfg.Burst, cfg.Workers)
	}
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s; %s; kube-apiserver %s. %s; the limit loop: %d goroutines, no client-side limit.\n\n",
		cpuModel(), runtime.NumCPU(), memTotal(), runtime.Version(), testenv.KubeVersion, settings, cfg.LimitWorkers)
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| convergence: %d triggers → children applied, cold start | %.2f s |\n", r.Triggers, r.ConvergenceSeconds)
	fmt.Fprintf(&b, "| limit: %d server-side applies from a plain client-go loop, %d goroutines, unthrottled | %.2f s |\n", r.Triggers, cfg.LimitWorkers, r.LimitSeconds)
	fmt.Fprintf(&b, "| convergence ratio (limit / syncloop; 1 = at the limit) | %.3f |\n", r.ConvergenceRatio)
	fmt.Fprintf(&b, "| hand-written client-go controller for the job (typed informers, protobuf, workqueue, %d workers, server-side apply with a controller reference, unthrottled), from its start: run before syncloop / after the phase, mean | %.2f / %.2f s, %.2f s |\n", handWorkers, r.HandWrittenBeforeSeconds, r.HandWrittenAfterSeconds, r.HandWrittenSeconds)
	fmt.Fprintf(&b, "| ratio (hand-written's mean / syncloop; 1 = as fast) | %.3f |\n", r.HandWrittenRatio)
	fmt.Fprintf(&b, "| CPU to converge: syncloop / the hand-written controller's mean | %.2f / %.2f s, %.2f× |\n", r.CPUSeconds, r.HandWrittenCPUSeconds, r.CPURatio)
	if len(r.Rounds) > 1 {
		var rounds []string
		for _, rd := range r.Rounds[1:] {
			rounds = append(rounds, fmt.Sprintf("%.2f s %.2f / %.2f s %.2f (%.3f, %.2f×)", rd.HandWrittenSeconds, rd.HandWrittenCPUSeconds, rd.Seconds, rd.CPUSeconds, rd.Ratio, rd.CPURatio))
		}
		fmt.Fprintf(&b, "| further rounds, hand-written / syncloop convergence and CPU s (ratio, CPU ratio); even rounds syncloop first | %s |\n", strings.Join(rounds, "; "))
		fmt.Fprintf(&b, "| **medians over the %d rounds**: convergence ratio (hand-written / syncloop), CPU ratio (syncloop / hand-written) | **%.3f, %.2f×** |\n", len(r.Rounds), r.MedianRatio, r.MedianCPURatio)
	}
	fmt.Fprintf(&b, "| API requests, cold start to converged | %d |\n", r.ColdStartRequests)
	fmt.Fprintf(&b, "| steady state, one full resync: writes | %d |\n", r.SteadyWrites)
	fmt.Fprintf(&b, "| steady state, one full resync: reads (GET/LIST) | %d |\n", r.SteadyReads)
	fmt.Fprintf(&b, "| informer cache heap per trigger as syncloop caches it (ConfigMaps typed from protobuf, managedFields stripped) | %.0f B |\n", r.HeapBytesPerObject)
	fmt.Fprintf(&b, "| the same, plain dynamic informer (unstructured, managedFields kept) | %.0f B (syncloop's = %.2f×) |\n", r.HeapBytesPerObjectUnstripped, r.HeapBytesPerObject/r.HeapBytesPerObjectUnstripped)
	fmt.Fprintf(&b, "| latency trigger update → child updated, p50 / p90 / p99 (%d updates) | %.1f / %.1f / %.1f ms |\n", cfg.Updates, r.LatencyP50Ms, r.LatencyP90Ms, r.LatencyP99Ms)
	fmt.Fprintf(&b, "| process RSS, converged on %d triggers | %.0f MiB |\n", r.Triggers, float64(r.RSSBytes)/(1<<20))
	fmt.Fprintf(&b, "| goroutines / informers after %d rule add/remove cycles, minus before | %+d / %+d |\n", cfg.Cycles, r.GoroutinesDelta, r.InformersDelta)
	fmt.Fprintf(&b, "| reload: rule file change → new rule applied, %d rules loaded (250 ms debounce included) | %.0f ms |\n", cfg.Rules, r.ReloadMs)
	return b.String()
}

// reportTenants is the Markdown table of the tenant workload's phase: each
// way of running it, the hand-written controller beside syncloop.
func reportTenants(tr TenantRun, r *TenantsResult) string {
	var b strings.Builder
	flags := flagsOf(tr)
	if tr.Workers > 0 {
		flags += fmt.Sprintf(", the rule's workers %d", tr.Workers)
	}
	fmt.Fprintf(&b, "## %s — tenant workload, N = %d\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), tr.Triggers)
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s; kube-apiserver %s. %d Tenant custom resources in a namespace of their own, each needing one ConfigMap, converged by the `syncloop run` binary with %s and by the hand-written client-go controller for the job (a process of its own: a dynamic informer on Tenants, a typed one on its ConfigMaps over protobuf, workqueue, %d workers, server-side apply with a controller reference, unthrottled), one after the other on one control plane. The client creating the Tenants: 32 goroutines.\n\n",
		cpuModel(), runtime.NumCPU(), memTotal(), testenv.KubeVersion, tr.Triggers, flags, handWorkers)
	rounds := max(1, tr.Rounds)
	if rounds > 1 {
		fmt.Fprintf(&b, "%d rounds of the three ways (odd rounds swap which controller of a pair runs first); each table gives the medians of its rounds, each ratio the median of the rounds' ratios, and the rounds' own ratios (convergence, CPU) follow it.\n\n", rounds)
	}
	for w, p := range r.Medians {
		h, s := p.HandWritten, p.Syncloop
		switch {
		case !s.Streamed:
			fmt.Fprintf(&b, "Tenants created before the controller starts, as the admin:\n\n")
		case !s.AsServiceAccounts:
			fmt.Fprintf(&b, "Tenants streamed in by the client from the controller's start, both as the admin (exempt from API Priority and Fairness):\n\n")
		default:
			fmt.Fprintf(&b, "Tenants streamed in from the controller's start, the controller and the client each a ServiceAccount bound to cluster-admin (API Priority and Fairness classifies both):\n\n")
		}
		fmt.Fprintf(&b, "| measure | hand-written | syncloop | ratio |\n|---|---|---|---|\n")
		fmt.Fprintf(&b, "| convergence: process start → %d ConfigMaps created | %.2f s | %.2f s | %.3f (hand-written / syncloop) |\n", s.Triggers, h.ConvergenceSeconds, s.ConvergenceSeconds, p.Ratio)
		fmt.Fprintf(&b, "| controller CPU to converge | %.1f s | %.1f s | %.2f× (syncloop / hand-written) |\n", h.CPUSeconds, s.CPUSeconds, p.CPURatio)
		fmt.Fprintf(&b, "| etcd + kube-apiserver CPU, controller start → converged, per trigger | %.2f ms | %.2f ms | %.2f× |\n",
			1000*h.ControlPlaneCPUSeconds/float64(h.Triggers), 1000*s.ControlPlaneCPUSeconds/float64(s.Triggers), s.ControlPlaneCPUSeconds/h.ControlPlaneCPUSeconds)
		fmt.Fprintf(&b, "| garbage collections to converge | %.0f | %.0f | |\n", h.GCCycles, s.GCCycles)
		fmt.Fprintf(&b, "| first write after start | %.2f s | %.2f s | |\n", h.FirstWriteSeconds, s.FirstWriteSeconds)
		fmt.Fprintf(&b, "| RSS at convergence / peak | %.0f / %.0f MiB | %.0f / %.0f MiB | %.2f× |\n",
			mib(h.RSSAtConvergenceBytes), mib(h.PeakRSSBytes), mib(s.RSSAtConvergenceBytes), mib(s.PeakRSSBytes), float64(s.RSSAtConvergenceBytes)/float64(h.RSSAtConvergenceBytes))
		fmt.Fprintf(&b, "| API writes to converge, per trigger | %.3f | %.3f | |\n", h.WritesPerTrigger, s.WritesPerTrigger)
		when := "alone, before the controller starts"
		if s.Streamed {
			when = "while the controller converges"
		}
		fmt.Fprintf(&b, "| the client's %d creates, %s: time, p50 / p99 latency | %.2f s, %.1f / %.1f ms | %.2f s, %.1f / %.1f ms | |\n",
			s.Triggers, when, h.ClientSeconds, h.ClientP50Ms, h.ClientP99Ms, s.ClientSeconds, s.ClientP50Ms, s.ClientP99Ms)
		if s.LimitSeconds > 0 {
			fmt.Fprintf(&b, "| limit: %d server-side applies from a plain client-go loop, %d goroutines, unthrottled / convergence | %.2f s | | %.3f (limit / syncloop) |\n", s.Triggers, tr.LimitWorkers, s.LimitSeconds, s.ConvergenceRatio)
		}
		if s.Updates > 0 {
			fmt.Fprintf(&b, "| %d triggers changed at once → all children updated | %.3f s | %.3f s | |\n", s.Updates, h.UpdateSeconds, s.UpdateSeconds)
		}
		if s.IdleSeconds > 0 {
			fmt.Fprintf(&b, "| writes while idle (%.0f s) / RSS after | %d / %.0f MiB | %d / %.0f MiB | |\n", s.IdleSeconds, h.IdleWrites, mib(h.RSSBytes), s.IdleWrites, mib(s.RSSBytes))
		}
		fmt.Fprintf(&b, "| syncloop's 429 answers / Failed Events | | %d / %d | |\n\n", s.TooManyRequests, s.FailedEvents)
		if rounds > 1 {
			var each []string
			for i := w; i < len(r.Pairs); i += len(r.Medians) {
				each = append(each, fmt.Sprintf("%.3f / %.2f×", r.Pairs[i].Ratio, r.Pairs[i].CPURatio))
			}
			fmt.Fprintf(&b, "Rounds: %s.\n\n", strings.Join(each, ", "))
		}
	}
	return b.String()
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// reportPushback is the Markdown table of a run under pushback.
func reportPushback(tr TenantRun, r *ProcessResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — under pushback, N = %d\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "The tenant workload, `syncloop run` with %s, as a ServiceAccount that API Priority and Fairness serves one request at a time (a priority level of one seat, no borrowing, limitResponse Reject: beyond it, 429 with Retry-After).\n\n", flagsOf(tr))
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| convergence: process start → %d ConfigMaps created | %.2f s |\n", r.Triggers, r.ConvergenceSeconds)
	fmt.Fprintf(&b, "| 429 answers, retried / Failed Events | %d / %d |\n", r.TooManyRequests, r.FailedEvents)
	fmt.Fprintf(&b, "| API writes to converge | %d (%.3f per trigger) |\n", r.Writes, r.WritesPerTrigger)
	return b.String()
}

// withNote puts note, if any, under the table's heading.
func withNote(table, note string) string {
	if note == "" {
		return table
	}
	heading, rest, _ := strings.Cut(table, "\n\n")
	return heading + "\n\n" + note + "\n\n" + rest
}

func flagsOf(tr TenantRun) string {
	if len(tr.Args) == 0 {
		return "its defaults"
	}
	return "`" + strings.Join(tr.Args, " ") + "`"
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	if kb := procKB("/proc/meminfo", "MemTotal:"); kb > 0 {
		return fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
	return "? GiB"
}
