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
	var cfg Config
	flag.IntVar(&cfg.Triggers, "n", 1000, "triggers, each needing one child")
	qps := flag.Float64("qps", 50, "client-side QPS, for syncloop and the limit alike")
	flag.IntVar(&cfg.Burst, "burst", 100, "client-side burst")
	flag.IntVar(&cfg.Workers, "workers", 2, "the rule's workers, and the limit loop's goroutines")
	flag.DurationVar(&cfg.Resync, "resync", 30*time.Second, "the rule's resync period (the steady-state phase waits for two)")
	flag.IntVar(&cfg.Updates, "updates", 200, "trigger updates the latency phase times")
	flag.IntVar(&cfg.Cycles, "cycles", 200, "rule add/remove cycles the churn phase makes")
	flag.IntVar(&cfg.Rules, "rules", 100, "rules the reload phase loads")
	record := flag.String("record", "", "append the results to this Markdown file (e.g. bench/RESULTS.md)")
	flag.Parse()
	cfg.QPS = float32(*qps)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) }
	env, err := testenv.Start(ctx, testenv.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	res, err := Run(ctx, env, cfg, logf)
	env.Stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	table := report(cfg, res)
	fmt.Print(table)
	if *record != "" {
		f, err := os.OpenFile(*record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = io.WriteString(f, table+"\n")
			f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
	line, _ := json.Marshal(res)
	fmt.Println(string(line))
}

// report is the Markdown table of a run, with the machine it ran on.
func report(cfg Config, r *Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — N = %d\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Triggers)
	fmt.Fprintf(&b, "Machine: %s, %d cores, %s; %s; kube-apiserver %s. Client QPS %.0f, burst %d, %d workers.\n\n",
		cpuModel(), runtime.NumCPU(), memTotal(), runtime.Version(), testenv.KubeVersion, cfg.QPS, cfg.Burst, cfg.Workers)
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| convergence: %d triggers → children applied, cold start | %.2f s |\n", r.Triggers, r.ConvergenceSeconds)
	fmt.Fprintf(&b, "| limit: %d server-side applies from a plain client-go loop | %.2f s |\n", r.Triggers, r.LimitSeconds)
	fmt.Fprintf(&b, "| convergence ratio (limit / syncloop; 1 = at the limit) | %.3f |\n", r.ConvergenceRatio)
	fmt.Fprintf(&b, "| API requests, cold start to converged | %d |\n", r.ColdStartRequests)
	fmt.Fprintf(&b, "| steady state, one full resync: writes | %d |\n", r.SteadyWrites)
	fmt.Fprintf(&b, "| steady state, one full resync: reads (GET/LIST) | %d |\n", r.SteadyReads)
	fmt.Fprintf(&b, "| informer cache heap per trigger, managedFields stripped | %.0f B |\n", r.HeapBytesPerObject)
	fmt.Fprintf(&b, "| the same, plain informer (managedFields kept) | %.0f B (stripped = %.2f×) |\n", r.HeapBytesPerObjectUnstripped, r.HeapBytesPerObject/r.HeapBytesPerObjectUnstripped)
	fmt.Fprintf(&b, "| latency trigger update → child updated, p50 / p90 / p99 (%d updates) | %.1f / %.1f / %.1f ms |\n", cfg.Updates, r.LatencyP50Ms, r.LatencyP90Ms, r.LatencyP99Ms)
	fmt.Fprintf(&b, "| process RSS, converged on %d triggers | %.0f MiB |\n", r.Triggers, float64(r.RSSBytes)/(1<<20))
	fmt.Fprintf(&b, "| goroutines / informers after %d rule add/remove cycles, minus before | %+d / %+d |\n", cfg.Cycles, r.GoroutinesDelta, r.InformersDelta)
	fmt.Fprintf(&b, "| reload: rule file change → new rule applied, %d rules loaded (250 ms debounce included) | %.0f ms |\n", cfg.Rules, r.ReloadMs)
	return b.String()
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
