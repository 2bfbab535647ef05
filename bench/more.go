package main

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/rules"
)

// heapAfterGC is the heap in use after two collections.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// cacheHeap measures the heap one informer over the N triggers of ns costs,
// per object: through syncloop's registry (managedFields stripped) and
// through a plain dynamic informer (kept).
func cacheHeap(ctx context.Context, dc k8sdynamic.Interface, ns string, n int) (stripped, unstripped float64, err error) {
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	key := dynamic.WatchKey{GVR: gvr, Namespace: ns, LabelSelector: "bench-trigger"}

	// Warm up: the first informer pays for one-time allocations (codecs,
	// clients) that would be charged to whichever is measured first.
	warm := dynamic.NewRegistry(dc, nil)
	if w, err := warm.Subscribe(ctx, key, cache.ResourceEventHandlerFuncs{}); err == nil {
		w.WaitForSync(ctx)
		w.Stop()
	}

	base := heapAfterGC()
	reg := dynamic.NewRegistry(dc, nil)
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
	inf := dynamicinformer.NewFilteredDynamicInformer(dc, gvr, ns, 0, cache.Indexers{},
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
		eng.Apply(ctx, both)
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return eng.Ready(), nil
		}); err != nil {
			return 0, fmt.Errorf("the added rule did not start: %w", err)
		}
		eng.Apply(ctx, base)
	}
	// Goroutines that are ending (HTTP keep-alives, watch streams) settle.
	var delta int
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		delta = runtime.NumGoroutine() - before
		return delta <= 0, nil
	})
	return delta, nil
}
