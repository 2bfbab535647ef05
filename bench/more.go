package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/reload"
)

// rss is this process's resident set size.
func rss() int64 { return procKB("/proc/self/status", "VmRSS:") << 10 }

// procKB reads the "<key> <n> kB" line of a /proc file; 0 if absent.
func procKB(file, key string) int64 {
	data, _ := os.ReadFile(file)
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, key); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb
		}
	}
	return 0
}

// heapAfterGC is the heap in use after two collections.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// cacheHeap measures the heap one informer over the N triggers of ns costs,
// per object: through syncloop's registry as syncloop runs it (protobuf:
// ConfigMaps cached typed, managedFields stripped) and through a plain
// dynamic informer (unstructured, managedFields kept).
func cacheHeap(ctx context.Context, cfg *rest.Config, ns string, n int) (stripped, unstripped float64, err error) {
	c, err := dynamic.NewClient(cfg)
	if err != nil {
		return 0, 0, err
	}
	dc := c.Dynamic
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	key := dynamic.WatchKey{GVR: gvr, Namespace: ns, LabelSelector: "bench-trigger"}

	// Warm up: the first informer pays for one-time allocations (codecs,
	// clients) that would be charged to whichever is measured first.
	warm := dynamic.NewRegistry(dc, nil)
	warm.Protobuf = c.Protobuf()
	if w, err := warm.Subscribe(ctx, key, cache.ResourceEventHandlerFuncs{}); err == nil {
		w.WaitForSync(ctx)
		w.Stop()
	}

	base := heapAfterGC()
	reg := dynamic.NewRegistry(dc, nil)
	reg.Protobuf = c.Protobuf()
	sub, err := reg.Subscribe(ctx, key, cache.ResourceEventHandlerFuncs{})
	if err != nil {
		return 0, 0, err
	}
	sub.WaitForSync(ctx)
	if got := len(sub.Indexer().ListKeys()); got != n {
		return 0, 0, fmt.Errorf("registry cached %d objects, want %d", got, n)
	}
	stripped = float64(int64(heapAfterGC())-int64(base)) / float64(n)
	runtime.KeepAlive(sub)
	sub.Stop()

	base = heapAfterGC()
	// The same namespace index the registry keeps, so only managedFields differ.
	inf := dynamicinformer.NewFilteredDynamicInformer(dc, gvr, ns, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(o *metav1.ListOptions) { o.LabelSelector = "bench-trigger" }).Informer()
	infCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(infCtx) }()
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)
	if got := len(inf.GetStore().ListKeys()); got != n {
		stop()
		<-done
		return 0, 0, fmt.Errorf("plain informer cached %d objects, want %d", got, n)
	}
	unstripped = float64(int64(heapAfterGC())-int64(base)) / float64(n)
	runtime.KeepAlive(inf)
	stop()
	<-done
	return stripped, unstripped, nil
}

// latency updates triggers one after another and times each until its
// child shows the new value (seen through a watch), while eng runs.
func latency(ctx context.Context, cs kubernetes.Interface, ns string, n, updates int) (p50, p90, p99 time.Duration, err error) {
	w, err := cs.CoreV1().ConfigMaps(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, 0, err
	}
	defer w.Stop()
	seen := make(chan string, 1024) // "<child>=<value>"
	go func() {
		for ev := range w.ResultChan() {
			if ev.Type != watch.Modified && ev.Type != watch.Added {
				continue
			}
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if ok && strings.HasSuffix(cm.Name, "-child") {
				seen <- cm.Name + "=" + cm.Data["value"]
			}
		}
	}()
	var lat []time.Duration
	for i := range updates {
		name := fmt.Sprintf("t-%05d", i%n)
		value := fmt.Sprintf("u%d", i)
		want := name + "-child=" + value
		start := time.Now()
		patch := []byte(`{"data":{"value":"` + value + `"}}`)
		if _, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, name, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
			return 0, 0, 0, err
		}
		timeout := time.After(30 * time.Second)
	wait:
		for {
			select {
			case s := <-seen:
				if s == want {
					break wait
				}
			case <-timeout:
				return 0, 0, 0, fmt.Errorf("child of %s never showed %s", name, value)
			}
		}
		lat = append(lat, time.Since(start))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	return pct(0.50), pct(0.90), pct(0.99), nil
}

// churn applies 200 rule sets with and without an extra rule, waiting for
// the extra one to run each time, and returns the goroutine count
// difference between before and after.
func churn(ctx context.Context, eng *engine.Engine, base, both *rules.Set, cycles int) (int, error) {
	before := runtime.NumGoroutine()
	for range cycles {
		eng.Enforce(ctx, both)
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return eng.Ready(), nil
		}); err != nil {
			return 0, fmt.Errorf("the added rule did not start: %w", err)
		}
		eng.Enforce(ctx, base)
	}
	// Goroutines that are ending (HTTP keep-alives, watch streams) settle.
	var delta int
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		delta = runtime.NumGoroutine() - before
		return delta <= 0, nil
	})
	return delta, nil
}

// reloadTime loads 100 rules from files, as `run` does (reload.Source and
// Watcher feeding the engine), then rewrites one rule's file and times how
// long until its new template has acted on its trigger's child.
func reloadTime(ctx context.Context, cl *dynamic.Client, mapper *dynamic.Mapper, cs kubernetes.Interface, ns string, rulesCount int) (time.Duration, error) {
	dir, err := os.MkdirTemp("", "syncloop-bench-rules-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	ruleText := func(i int, value string) string {
		return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: reload-%03d}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: %s, labelSelector: "bench-reload=r%03d"}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-reloaded"}
        data: {value: "%s"}
`, i, ns, i, value)
	}
	for i := range rulesCount {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("rule-%03d.yaml", i)), []byte(ruleText(i, "before")), 0o644); err != nil {
			return 0, err
		}
	}
	loader, err := rules.NewLoader(expr.Options{})
	if err != nil {
		return 0, err
	}
	src := reload.NewSource(loader, []string{dir})
	first := src.Load()
	if len(first.Errors) > 0 || first.Set.Len() != rulesCount {
		return 0, fmt.Errorf("loading %d rules: %d loaded, errors %v", rulesCount, first.Set.Len(), first.Errors)
	}
	eng := engine.New(engine.Options{Client: cl, Mapper: mapper})
	updates := make(chan *rules.Set, 1)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	w := reload.NewWatcher(src, 0)
	wg.Add(2)
	go func() { defer wg.Done(); _ = eng.Run(runCtx, first.Set, updates) }()
	go func() {
		defer wg.Done()
		_ = w.Run(runCtx, func(st reload.Status) {
			select {
			case <-updates:
			default:
			}
			updates <- st.Set
		})
	}()
	<-w.Ready()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return eng.Ready(), nil
	}); err != nil {
		return 0, fmt.Errorf("%d rules did not start", rulesCount)
	}
	trigger := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "reload-trigger", Labels: map[string]string{"bench-reload": "r000"}}}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, trigger, metav1.CreateOptions{}); err != nil {
		return 0, err
	}
	childValue := func() string {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "reload-trigger-reloaded", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return cm.Data["value"]
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return childValue() == "before", nil
	}); err != nil {
		return 0, errors.New("the first rule never made its child")
	}
	start := time.Now()
	tmp := filepath.Join(dir, ".rule-000.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(ruleText(0, "after")), 0o644); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "rule-000.yaml")); err != nil {
		return 0, err
	}
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return childValue() == "after", nil
	}); err != nil {
		return 0, errors.New("the changed rule never took effect")
	}
	return time.Since(start), nil
}
