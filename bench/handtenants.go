package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"
)

// handTenantsEnv, when set in the environment, makes the benchmark's binary
// (or its test binary) the hand-written tenant controller instead, with
// the flags of handTenantsMain: a process of its own, so that its CPU and
// memory are measured as syncloop's are.
const handTenantsEnv = "SYNCLOOP_BENCH_HAND_TENANTS"

// handTenantsMain runs the hand-written controller for the tenant workload
// until SIGTERM: the controller a Go programmer writes for the job instead
// of a rule, as client-go's sample-controller has it — a shared informer
// on the Tenants (dynamic: client-go has no types for a custom resource)
// and a typed one on its ConfigMaps (protobuf on the wire), event handlers
// that enqueue a Tenant on its own changes and on its ConfigMap's (through
// the controller reference), a rate-limited workqueue, workers
// goroutines, and a ConfigMap applied server-side with a controller
// reference to its Tenant unless the cached one already holds the desired
// data. No client-side rate limit, as syncloop's default. It serves
// /metrics: the process's CPU and memory and client-go's request counts.
func handTenantsMain(args []string) int {
	fs := flag.NewFlagSet("hand-tenants", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig to act with")
	ns := fs.String("namespace", "", "the Tenants' namespace")
	addr := fs.String("metrics-bind-address", "", "where /metrics is served")
	workers := fs.Int("workers", handWorkers, "worker goroutines")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runHandTenants(ctx, *kubeconfig, *ns, *addr, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "hand-written tenant controller:", err)
		return 1
	}
	return 0
}

func runHandTenants(ctx context.Context, kubeconfig, ns, addr string, workers int) error {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total", Help: "client-go's API requests."},
		[]string{"code", "method", "host"})
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector(), requests)
	clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: requestCounter{requests}})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, 0
	dc, err := k8sdynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c := &handTenants{cs: cs, ns: ns,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	defer c.queue.ShutDown()
	c.tenants = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dc, 0, ns, nil).ForResource(tenants).Informer()
	c.children = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = handLabel })).Core().V1().ConfigMaps().Informer()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	_, _ = c.tenants.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }})
	owner := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			if ref := metav1.GetControllerOf(cm); ref != nil && ref.Kind == "Tenant" {
				c.queue.Add(cm.Namespace + "/" + ref.Name)
			}
		}
	}
	_, _ = c.children.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: owner,
		UpdateFunc: func(old, o any) {
			if old.(*corev1.ConfigMap).ResourceVersion != o.(*corev1.ConfigMap).ResourceVersion {
				owner(o)
			}
		},
		DeleteFunc: owner,
	})
	go c.tenants.RunWithContext(ctx)
	go c.children.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.tenants.HasSynced, c.children.HasSynced) {
		return nil // stopped before the caches synced
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

type requestCounter struct{ c *prometheus.CounterVec }

func (r requestCounter) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

// handTenants is the hand-written tenant controller's state.
type handTenants struct {
	cs                kubernetes.Interface
	ns                string
	queue             workqueue.TypedRateLimitingInterface[string]
	tenants, children cache.SharedIndexInformer
}

func (c *handTenants) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(ctx, key); err != nil {
		if !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "syncing %s: %v\n", key, err)
		}
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// sync brings Tenant key's ConfigMap, tenant-<name>, to what it wants: the
// Tenant's tier. A deleted Tenant's ConfigMap is the garbage collector's.
func (c *handTenants) sync(ctx context.Context, key string) error {
	obj, exists, err := c.tenants.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	t := obj.(*unstructured.Unstructured)
	tier, _, _ := unstructured.NestedString(t.Object, "spec", "tier")
	name := "tenant-" + t.GetName()
	want := map[string]string{"tier": tier}
	cached, ok, _ := c.children.GetIndexer().GetByKey(c.ns + "/" + name)
	if ok && maps.Equal(cached.(*corev1.ConfigMap).Data, want) {
		return nil
	}
	cm := corev1apply.ConfigMap(name, c.ns).
		WithLabels(map[string]string{handLabel: t.GetName()}).
		WithOwnerReferences(metav1apply.OwnerReference().WithAPIVersion(t.GetAPIVersion()).WithKind(t.GetKind()).
			WithName(t.GetName()).WithUID(t.GetUID()).WithController(true)).
		WithData(want)
	_, err = c.cs.CoreV1().ConfigMaps(c.ns).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: "bench-hand", Force: true})
	return err
}
