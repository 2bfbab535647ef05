// Command soak churns syncloop for a given time and prints its memory and
// goroutines as it goes: triggers created and deleted in batches (each
// getting a child, each child pruned) and a rule added and removed between
// batches. It starts a local control plane of its own (hack/testenv.sh must
// have built it) and runs the engine in this process, so the numbers are
// syncloop's. Not part of the test suite: run it with `make soak`.
//
//	go run ./hack/soak -duration 30m -every 30s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

const ruleText = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %[1]s}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: soak, labelSelector: %[1]s}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-%[1]s"}
        data: ${object.?data}
`

func main() {
	duration := flag.Duration("duration", 10*time.Minute, "how long to churn")
	every := flag.Duration("every", 30*time.Second, "how often to print a line")
	batch := flag.Int("batch", 200, "triggers created, then deleted, per batch")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *duration, *every, *batch); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, duration, every time.Duration, batch int) error {
	env, err := testenv.Start(ctx, testenv.Options{})
	if err != nil {
		return err
	}
	defer env.Stop()
	cfg := env.Config()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cl, err := dynamic.NewClient(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "soak"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	loader, err := rules.NewLoader(expr.Options{})
	if err != nil {
		return err
	}
	set := func(names ...string) (*rules.Set, error) {
		var docs []string
		for _, n := range names {
			docs = append(docs, fmt.Sprintf(ruleText, n))
		}
		f, err := loader.Parse("soak.yaml", []byte(strings.Join(docs, "---\n")))
		if err != nil {
			return nil, err
		}
		return rules.NewSet(f)
	}
	base, err := set("churn")
	if err != nil {
		return err
	}
	both, err := set("churn", "extra")
	if err != nil {
		return err
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	eng := engine.New(engine.Options{Client: cl, Mapper: dynamic.NewMapper(disco, 0),
		Recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "syncloop"})})
	engCtx, cancel := context.WithCancel(ctx)
	updates := make(chan *rules.Set)
	done := make(chan struct{})
	go func() { defer close(done); _ = eng.Run(engCtx, base, updates) }()
	defer func() { cancel(); <-done }()

	cms := cs.CoreV1().ConfigMaps("soak")
	children := func() int {
		l, err := cms.List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=churn"})
		if err != nil {
			return -1
		}
		return len(l.Items)
	}
	until := func(cond func() bool) error {
		return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) { return cond(), nil })
	}

	fmt.Printf("%8s %9s %7s %10s %10s %10s %6s\n", "elapsed", "triggers", "rules", "heap MiB", "RSS MiB", "goroutines", "informers")
	start, next := time.Now(), time.Now()
	cycles, ruleCycles := 0, 0
	for round := 0; time.Since(start) < duration && ctx.Err() == nil; round++ {
		if !time.Now().Before(next) {
			var m runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m)
			fmt.Printf("%8s %9d %7d %10.1f %10.1f %10d %6d\n", time.Since(start).Round(time.Second), cycles, ruleCycles,
				float64(m.HeapAlloc)/(1<<20), float64(rss())/(1<<20), runtime.NumGoroutine(), eng.Informers())
			next = next.Add(every)
		}
		names := make([]string, batch)
		for i := range names {
			names[i] = fmt.Sprintf("t%d-%d", round, i)
		}
		if err := parallel(ctx, names, func(ctx context.Context, n string) error {
			_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"churn": "yes"}},
				Data: map[string]string{"round": fmt.Sprint(round)}}, metav1.CreateOptions{})
			return err
		}); err != nil {
			return err
		}
		if err := until(func() bool { return children() == batch }); err != nil {
			return fmt.Errorf("children of round %d: %w", round, err)
		}
		updates <- both
		updates <- base
		ruleCycles++
		if err := parallel(ctx, names, func(ctx context.Context, n string) error {
			return cms.Delete(ctx, n, metav1.DeleteOptions{})
		}); err != nil {
			return err
		}
		if err := until(func() bool { return children() == 0 }); err != nil {
			return fmt.Errorf("pruning round %d: %w", round, err)
		}
		cycles += batch
	}
	return nil
}

// rss is this process's resident set, from /proc (0 elsewhere).
func rss() int64 {
	data, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

// parallel runs f for every name, twenty at a time, and returns the first
// error.
func parallel(ctx context.Context, names []string, f func(context.Context, string) error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	work := make(chan string)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				if err := f(ctx, n); err != nil {
					once.Do(func() { first = err })
				}
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	return first
}
