package main

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1apply "k8s.io/client-go/applyconfigurations/core/v1"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/syncloop/syncloop/internal/testenv"
)

// handLabel marks the hand-written controller's children.
const handLabel = "bench-hand-child"

// handWritten converges the in-process workload's n triggers, created in a
// namespace of their own before it starts, with the controller a Go
// programmer would write for the job instead of a rule — as the client-go
// textbook has it: typed shared informers on the triggers and on its
// children (protobuf on the wire), a rate-limited workqueue, workers
// goroutines, a child applied server-side — controlled by its trigger, as
// sample-controller's are — unless the cached one already holds the
// desired data, and no client-side rate limit (as syncloop's
// default). It returns the time from its start — informers listing
// included — to the n-th child applied, and the namespace it ran in.
func handWritten(ctx context.Context, env *testenv.Env, w workload, n, workers int, started func()) (time.Duration, string, error) {
	ns, _, _, err := w.prepare(ctx, env, n, "bench-hand-", nil)
	if err != nil {
		return 0, "", err
	}
	cfg := rest.CopyConfig(env.Config())
	cfg.QPS, cfg.Burst = -1, 0
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, "", err
	}
	if started != nil {
		started()
	}
	start := time.Now()
	c := &handController{cs: cs, ns: ns,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	informer := func(selector string) cache.SharedIndexInformer {
		return informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector })).Core().V1().ConfigMaps().Informer()
	}
	c.triggers, c.children = informer("bench-trigger"), informer(handLabel)
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	_, _ = c.triggers.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }})
	owner := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			c.queue.Add(ns + "/" + cm.Labels[handLabel])
		}
	}
	_, _ = c.children.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, o any) { owner(o) }, DeleteFunc: owner})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer c.queue.ShutDown()
	go c.triggers.RunWithContext(runCtx)
	go c.children.RunWithContext(runCtx)
	if !cache.WaitForCacheSync(runCtx.Done(), c.triggers.HasSynced, c.children.HasSynced) {
		return 0, "", ctx.Err()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for range workers {
		wg.Go(func() {
			for c.next(runCtx) {
			}
		})
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		return c.applied.Load() >= int64(n), nil
	}); err != nil {
		return 0, "", fmt.Errorf("the hand-written controller did not converge: %d of %d children", c.applied.Load(), n)
	}
	took := time.Unix(0, c.last.Load()).Sub(start)
	cancel()
	c.queue.ShutDown()
	return took, ns, nil
}

// handController is the hand-written controller's state.
type handController struct {
	cs                 kubernetes.Interface
	ns                 string
	queue              workqueue.TypedRateLimitingInterface[string]
	triggers, children cache.SharedIndexInformer
	applied, last      atomic.Int64 // children applied; when the last was
}

func (c *handController) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(ctx, key); err != nil {
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// sync brings trigger key's child to what it wants: a ConfigMap named
// <trigger>-child holding its name and value.
func (c *handController) sync(ctx context.Context, key string) error {
	obj, exists, err := c.triggers.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	trigger := obj.(*corev1.ConfigMap)
	name := trigger.Name + "-child"
	want := map[string]string{"from": trigger.Name, "value": trigger.Data["value"]}
	if cached, ok, _ := c.children.GetIndexer().GetByKey(c.ns + "/" + name); ok && maps.Equal(cached.(*corev1.ConfigMap).Data, want) {
		return nil
	}
	child := corev1apply.ConfigMap(name, c.ns).WithLabels(map[string]string{handLabel: trigger.Name}).WithData(want).
		WithOwnerReferences(metav1apply.OwnerReference().WithAPIVersion("v1").WithKind("ConfigMap").WithName(trigger.Name).
			WithUID(trigger.UID).WithController(true).WithBlockOwnerDeletion(true))
	if _, err := c.cs.CoreV1().ConfigMaps(c.ns).Apply(ctx, child, metav1.ApplyOptions{FieldManager: "bench-hand", Force: true}); err != nil {
		return err
	}
	c.applied.Add(1)
	c.last.Store(time.Now().UnixNano())
	return nil
}
