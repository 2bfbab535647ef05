package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// A rule's controller is in one of these states (RuleState.State).
const (
	// StateWaiting: a kind of the rule is not served (yet).
	StateWaiting = "waiting"
	// StateSyncing: the rule's informers are listing, or cannot (the
	// detail says why: RBAC, an unreachable API server).
	StateSyncing = "syncing"
	// StateRunning: the rule reconciles.
	StateRunning = "running"
	// StateFailed: the rule cannot run as written here (a cluster-scoped
	// kind under --watch-namespace); changing the rule restarts it.
	StateFailed = "failed"
)

// childrenSelector selects every object an installation of syncloop
// manages (the default installation's children carry no installation
// label): child informers are shared by the installation's rules, one per
// kind, and never see another installation's children.
func childrenSelector(installation string) string {
	if installation == "" {
		return rules.LabelManagedBy + "=" + rules.ManagedByValue + ",!" + rules.LabelInstallation
	}
	return rules.LabelManagedBy + "=" + rules.ManagedByValue + "," + rules.LabelInstallation + "=" + installation
}

// controller is one rule's RuleController: its trigger and child
// subscriptions, its workqueue and workers, its periodic resync.
type controller struct {
	e      *Engine
	rule   *rules.Rule
	queue  workqueue.TypedRateLimitingInterface[cache.ObjectName]
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned

	// Set by run before any worker starts; read-only afterwards.
	triggerMapping *meta.RESTMapping
	trigger        *dynamic.Subscription
	children       map[schema.GroupVersionKind]*childKind
	lookups        []*lookupWatch // one per rule lookup
	patches        []*patchWatch  // one per mode: patch resource, then the retired

	deps      *lookupIndex // which triggers read which looked-up objects
	patchDeps *lookupIndex // which triggers patch which objects (by resource index)

	// Counters, for tests and diagnostics.
	resyncs    atomic.Int64 // resync passes done
	reconciles atomic.Int64 // reconciles finished
	inFlight   atomic.Int64 // reconciles under way

	retired        []schema.GroupVersionKind // see newController
	retiredPatches []*patchWatch             // see newController

	// writes is what the controller remembers of its own writes.
	writes *ownWrites

	mu       sync.Mutex // guards state, detail, syncedAt and working
	state    string
	detail   string
	syncedAt time.Time // when the informers the workers need had synced
	// working are the triggers being reconciled or released, by key
	// digest, each with the cancel of its requests (see SetShard).
	working map[uint64]context.CancelFunc

	// Sharding: reshard signals a new shard (SetShard); shardSeen is the
	// shard the controller last queued triggers for (run's goroutine only);
	// triggerSub is the trigger informer once subscribed, for Owned.
	reshard    chan struct{}
	shardSeen  Shard
	triggerSub atomic.Pointer[dynamic.Subscription]
}

// childKind is one kind of child: how to reach it and its shared informer.
type childKind struct {
	mapping *meta.RESTMapping
	sub     *dynamic.Subscription
	// retired: the rule made this kind before it changed and makes it no
	// more. Its children are watched only to be pruned, best effort: the
	// rule neither waits for the kind nor for its informer.
	retired bool
}

// childRef names a child object.
type childRef struct {
	gvk       schema.GroupVersionKind
	namespace string
	name      string
}

func refOf(obj *unstructured.Unstructured) childRef {
	return childRef{gvk: obj.GroupVersionKind(), namespace: obj.GetNamespace(), name: obj.GetName()}
}

// newController makes the controller of rule r. retired are kinds an
// earlier version of the rule made and r does not: their children are
// pruned. retiredPatches are the patch watches of earlier versions: what
// they patched and r does not is released.
func newController(e *Engine, r *rules.Rule, retired []schema.GroupVersionKind, retiredPatches []*patchWatch) *controller {
	limiter := workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](r.RateLimit.BaseDelay, r.RateLimit.MaxDelay),
		&workqueue.TypedBucketRateLimiter[cache.ObjectName]{Limiter: rate.NewLimiter(rate.Limit(r.RateLimit.QPS), r.RateLimit.Burst)},
	)
	return &controller{
		e:    e,
		rule: r,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter,
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: r.Name, MetricsProvider: e.queues}),
		done:           make(chan struct{}),
		children:       map[schema.GroupVersionKind]*childKind{},
		deps:           newLookupIndex(),
		patchDeps:      newLookupIndex(),
		retiredPatches: retiredPatches,
		writes:         newOwnWrites(),
		working:        map[uint64]context.CancelFunc{},
		reshard:        make(chan struct{}, 1),
		state:          StateWaiting,
		retired:        retired,
	}
}

func (c *controller) start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	go func() {
		defer close(c.done)
		c.run(ctx)
	}()
}

// stop cancels the controller and waits until it has drained and stopped.
func (c *controller) stop() {
	c.cancel()
	<-c.done
}

func (c *controller) setState(state, detail string) {
	c.mu.Lock()
	c.state, c.detail = state, detail
	c.mu.Unlock()
}

func (c *controller) getState() (string, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state, c.detail
}

// run is the controller's life: resolve kinds (waiting while one is not
// served), subscribe to informers, wait for the children's to sync, work
// while the triggers list, sweep for orphans once they have, then work
// until ctx ends and drain.
func (c *controller) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	defer c.unsubscribe()
	c.shardSeen = c.e.currentShard()
	if !c.resolve(ctx) {
		c.queue.ShutDown()
		return
	}
	if err := c.checkNamespace(); err != nil {
		logger.Error(err, "Rule cannot run")
		c.setState(StateFailed, err.Error())
		c.queue.ShutDown()
		return
	}
	c.setState(StateSyncing, "")
	if err := c.subscribe(ctx); err != nil {
		logger.Error(err, "Cannot watch")
		c.setState(StateWaiting, err.Error())
		c.queue.ShutDown()
		return
	}
	// Workers start once the children's caches have synced: a reconcile
	// needs every existing child to decide what to write and prune. The
	// triggers may still be listing: each is reconciled as it arrives (a
	// reconcile whose trigger has not arrived yet does nothing), so a cold
	// start does not wait for the whole list.
	var children []*dynamic.Subscription
	for _, ck := range c.children {
		if !ck.retired {
			children = append(children, ck.sub)
		}
	}
	// So do the lookups' caches: a lookup read from a cache still listing
	// would find nothing, and a rule's children could be pruned for it.
	for _, lw := range c.lookups {
		children = append(children, lw.sub)
	}
	for _, pw := range c.patches {
		if pw.res != nil {
			children = append(children, pw.sub)
		}
	}
	if !c.waitForSync(ctx, children) {
		c.queue.ShutDown()
		return
	}
	c.mu.Lock()
	c.syncedAt = time.Now()
	c.mu.Unlock()

	// Workers get a context that outlives ctx by the drain timeout, so
	// that in-flight reconciles finish on shutdown.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var wg sync.WaitGroup
	for range c.rule.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.processNext(workCtx) {
			}
		}()
	}
	go c.afterRetiredPatches(ctx)
	if c.waitForSync(ctx, []*dynamic.Subscription{c.trigger}) {
		c.sweep(ctx) // children whose trigger went away while syncloop was down
		c.setState(StateRunning, "")
		logger.Info("Rule running", "workers", c.rule.Workers)
	}

	var tick <-chan time.Time
	if c.rule.ResyncPeriod > 0 {
		t := time.NewTicker(c.rule.ResyncPeriod)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			c.resync(ctx)
			continue
		case <-c.reshard:
			c.resharded(ctx)
			continue
		case <-ctx.Done():
		}
		break
	}
	logger.V(1).Info("Rule stopping: draining its queue")
	timer := time.AfterFunc(c.e.drain, cancelWork)
	defer timer.Stop()
	c.queue.ShutDownWithDrain()
	wg.Wait()
}

// resolve maps the trigger kind and every child kind, retrying with backoff
// while one is not served (a CRD not installed yet). It returns false when
// ctx ends first.
func (c *controller) resolve(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	kinds := []schema.GroupVersionKind{c.rule.Watch.GVK}
	for _, r := range c.rule.Resources {
		kinds = append(kinds, r.GVK)
	}
	for _, l := range c.rule.Lookups {
		kinds = append(kinds, l.GVK)
	}
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		var missing error
		for _, gvk := range kinds {
			m, err := c.e.mapper.Mapping(ctx, gvk)
			if err != nil {
				missing = fmt.Errorf("kind %s: %w", gvk, err)
				break
			}
			if gvk == c.rule.Watch.GVK {
				c.triggerMapping = m
			}
			if c.isChildKind(gvk) && c.children[gvk] == nil {
				c.children[gvk] = &childKind{mapping: m}
			}
		}
		if missing == nil {
			c.lookups = c.lookups[:0]
			for i, l := range c.rule.Lookups {
				m, _ := c.e.mapper.Mapping(ctx, l.GVK) // mapped above
				c.lookups = append(c.lookups, &lookupWatch{index: i, mapping: m})
			}
			c.patches = c.patches[:0]
			current := map[dynamic.WatchKey]bool{}
			for _, res := range c.rule.Resources {
				if res.Mode == rules.ModePatch {
					m, _ := c.e.mapper.Mapping(ctx, res.GVK) // mapped above
					pw := &patchWatch{res: res, mapping: m, key: c.patchWatchKey(res, m)}
					current[pw.key] = true
					c.patches = append(c.patches, pw)
				}
			}
			for _, old := range c.retiredPatches {
				if !current[old.key] {
					current[old.key] = true
					c.patches = append(c.patches, &patchWatch{key: old.key, mapping: old.mapping})
				}
			}
			for _, gvk := range c.retired {
				if m, err := c.e.mapper.Mapping(ctx, gvk); err == nil && c.children[gvk] == nil {
					c.children[gvk] = &childKind{mapping: m, retired: true}
				}
			}
			return true
		}
		c.setState(StateWaiting, missing.Error())
		logger.Info("Rule waiting for a kind the API server does not serve", "err", missing)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(backoff.Step()):
		}
	}
}

// watchNamespace is the namespace the rule's triggers are watched in: the
// rule's own, else the engine's (empty: all).
func (c *controller) watchNamespace() string {
	if c.rule.Watch.Namespace != "" {
		return c.rule.Watch.Namespace
	}
	return c.e.ns
}

// checkNamespace reports why the rule cannot run in the engine's namespace,
// if the engine is limited to one.
func (c *controller) checkNamespace() error {
	ns := c.e.ns
	if ns == "" {
		return nil
	}
	w := c.rule.Watch
	switch {
	case c.triggerMapping.Scope.Name() != meta.RESTScopeNameNamespace:
		return fmt.Errorf("it watches %s, which is cluster-scoped, but syncloop is limited to namespace %q (--watch-namespace)", w.Kind, ns)
	case w.Namespace != "" && w.Namespace != ns:
		return fmt.Errorf("it watches namespace %q, but syncloop is limited to namespace %q (--watch-namespace)", w.Namespace, ns)
	}
	for gvk, ck := range c.children {
		if !ck.retired && ck.mapping.Scope.Name() != meta.RESTScopeNameNamespace {
			return fmt.Errorf("its children include %s, which is cluster-scoped, but syncloop is limited to namespace %q (--watch-namespace)", gvk.Kind, ns)
		}
	}
	for _, pw := range c.patches {
		switch {
		case pw.res == nil:
		case pw.mapping.Scope.Name() != meta.RESTScopeNameNamespace:
			return fmt.Errorf("resource %q patches %s, which is cluster-scoped, but syncloop is limited to namespace %q (--watch-namespace)", pw.res.ID, pw.res.Kind, ns)
		case pw.res.LiteralNamespace != "" && pw.res.LiteralNamespace != ns:
			return fmt.Errorf("resource %q patches namespace %q, but syncloop is limited to namespace %q (--watch-namespace)", pw.res.ID, pw.res.LiteralNamespace, ns)
		}
	}
	for _, lw := range c.lookups {
		l := c.rule.Lookups[lw.index]
		switch {
		case lw.mapping.Scope.Name() != meta.RESTScopeNameNamespace:
			return fmt.Errorf("lookup %q reads %s, which is cluster-scoped, but syncloop is limited to namespace %q (--watch-namespace)", l.ID, l.Kind, ns)
		case l.Namespace.IsLiteral() && l.Namespace.Literal != "" && l.Namespace.Literal != ns:
			return fmt.Errorf("lookup %q reads namespace %q, but syncloop is limited to namespace %q (--watch-namespace)", l.ID, l.Namespace.Literal, ns)
		}
	}
	return nil
}

func (c *controller) isChildKind(gvk schema.GroupVersionKind) bool {
	for _, r := range c.rule.Resources {
		if r.GVK == gvk && r.Mode != rules.ModePatch {
			return true
		}
	}
	return false
}

func (c *controller) subscribe(ctx context.Context) error {
	w := c.rule.Watch
	key := dynamic.WatchKey{GVR: c.triggerMapping.Resource, LabelSelector: w.LabelSelector.String(), FieldSelector: w.FieldSelector.String()}
	if c.triggerMapping.Scope.Name() == meta.RESTScopeNameNamespace {
		key.Namespace = c.watchNamespace()
	}
	sub, err := c.e.registry.Subscribe(ctx, key, cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if c.wants(obj) {
				c.enqueue(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			// Old or new: a trigger that stops matching is reconciled once
			// more, and its children pruned.
			if c.wants(old) || c.wants(obj) {
				c.enqueue(obj)
			}
		},
		DeleteFunc: c.enqueue,
	})
	if err != nil {
		return err
	}
	c.trigger = sub
	c.triggerSub.Store(sub)
	for _, ck := range c.children {
		sub, err := c.e.registry.Subscribe(ctx, dynamic.WatchKey{GVR: ck.mapping.Resource, Namespace: c.e.ns, LabelSelector: childrenSelector(c.rule.Installation)},
			cache.ResourceEventHandlerFuncs{
				AddFunc:    c.childChanged,
				UpdateFunc: func(_, obj any) { c.childChanged(obj) },
				DeleteFunc: func(obj any) {
					c.forget(obj)
					c.enqueueOwner(obj)
				},
			})
		if err != nil && ck.retired {
			continue
		}
		if err != nil {
			return err
		}
		ck.sub = sub
	}
	if err := c.subscribeLookups(ctx); err != nil {
		return err
	}
	return c.subscribePatches(ctx)
}

func (c *controller) unsubscribe() {
	if c.trigger != nil {
		c.trigger.Stop()
	}
	for _, ck := range c.children {
		if ck.sub != nil {
			ck.sub.Stop()
		}
	}
	for _, lw := range c.lookups {
		if lw.sub != nil {
			lw.sub.Stop()
		}
	}
	for _, pw := range c.patches {
		if pw.sub != nil {
			pw.sub.Stop()
		}
	}
}

// waitForSync waits until the informers of subs have synced, and reports
// false if ctx ends first. While one has not, the rule's detail says why —
// a list or watch the API server refused (missing RBAC) or could not
// answer — and each new reason is logged once; the informers retry with
// backoff meanwhile.
func (c *controller) waitForSync(ctx context.Context, subs []*dynamic.Subscription) bool {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	logged := ""
	for _, s := range subs {
		for !s.HasSynced() {
			select {
			case <-s.Synced():
			case <-ctx.Done():
				return false
			case <-tick.C:
				detail, failing := syncDetail(subs)
				c.setState(StateSyncing, detail)
				if failing && detail != logged {
					logged = detail
					klog.FromContext(ctx).Error(nil, "Rule cannot start: its informers cannot sync", "reason", detail)
				}
			}
		}
	}
	return true
}

// syncDetail says why subs have not all synced, and whether because a
// list or watch fails.
func syncDetail(subs []*dynamic.Subscription) (detail string, failing bool) {
	for _, s := range subs {
		if s.HasSynced() {
			continue
		}
		if err := s.LastError(); err != nil {
			return fmt.Sprintf("cannot list and watch %s: %v", s.Key(), err), true
		}
		detail = "listing " + s.Key().String()
	}
	return detail, false
}

// wants evaluates the rule's `when` for an event's object. An evaluation
// error counts as wanted: the reconcile reports it.
func (c *controller) wants(obj any) bool {
	if c.rule.When == nil {
		return true
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return true
	}
	ok, err := c.rule.When.EvalBool(context.Background(), &expr.Activation{Object: u.Object, Rule: c.rule.Name})
	return ok || err != nil
}

func (c *controller) enqueue(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	key, err := cache.ObjectToName(obj)
	if err != nil {
		return
	}
	c.add(key)
}

// enqueueOwner queues the trigger of a child of this rule (drift repair: an
// edited or deleted child is reconciled back).
func (c *controller) enqueueOwner(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil || m.GetLabels()[rules.LabelRule] != c.rule.Name {
		return
	}
	if key, ok := c.ownTrigger(m.GetAnnotations()[rules.AnnotationOwner]); ok {
		c.add(key)
	}
}

// childChanged queues the trigger of a child that was added or updated —
// unless the event is the echo of syncloop's own last apply of it (the
// version that apply returned), which changes nothing the reconcile that
// made it did not already see: a cold start then costs one reconcile per
// trigger, not two. An event that arrives while syncloop's own apply of
// the child is still returning is held (ownWrites.echo): the apply's end
// queues the trigger if it was not the echo.
func (c *controller) childChanged(obj any) {
	if u, ok := obj.(*unstructured.Unstructured); ok && c.writes.echo(refOf(u), u.GetResourceVersion()) {
		return
	}
	c.enqueueOwner(obj)
}

// forget drops what the controller remembers of a child that is gone.
func (c *controller) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if u, ok := obj.(*unstructured.Unstructured); ok {
		c.writes.gone(refOf(u))
	}
}

// ownTrigger parses a child's owner annotation and reports whether the
// trigger it names is one this rule watches: its kind, and its namespace
// when the watch is limited to one. A child whose trigger this rule cannot
// see — another syncloop's, a same-named rule watching elsewhere — is never
// this rule's to repair or prune.
func (c *controller) ownTrigger(owner string) (cache.ObjectName, bool) {
	t, ok := rules.ParseTrigger(owner)
	w := c.rule.Watch
	if !ok || t.APIVersion != w.APIVersion || t.Kind != w.Kind {
		return cache.ObjectName{}, false
	}
	key := cache.ObjectName{Namespace: t.Namespace, Name: t.Name}
	if ns := c.watchNamespace(); ns != "" && c.triggerMapping.Scope.Name() == meta.RESTScopeNameNamespace && key.Namespace != ns {
		return cache.ObjectName{}, false
	}
	return key, true
}

// resync re-checks every trigger and sweeps for orphans.
func (c *controller) resync(ctx context.Context) {
	for _, key := range c.trigger.Indexer().ListKeys() {
		if name, err := cache.ParseObjectName(key); err == nil {
			c.add(name)
		}
	}
	c.sweep(ctx)
	c.resyncs.Add(1)
}

// sweep queues the trigger of every child of this rule whose trigger is
// not in the cache (or is another object of the same name): its reconcile
// prunes the child. This is how a trigger deleted while syncloop was down
// is cleaned up.
func (c *controller) sweep(ctx context.Context) {
	n := 0
	for _, ck := range c.children {
		if ck.sub == nil {
			continue
		}
		objs, err := ck.sub.Indexer().ByIndex(ruleIndex, c.rule.Name)
		if err != nil {
			continue
		}
		for _, o := range objs {
			m, err := meta.Accessor(o)
			if err != nil {
				continue
			}
			key, ok := c.ownTrigger(m.GetAnnotations()[rules.AnnotationOwner])
			if !ok {
				continue
			}
			t, exists, _ := c.trigger.Indexer().GetByKey(key.String())
			if !exists || string(t.(*unstructured.Unstructured).GetUID()) != m.GetLabels()[rules.LabelOwnerUID] {
				c.add(key)
				n++
			}
		}
	}
	if n > 0 {
		klog.FromContext(ctx).V(1).Info("Queued triggers of orphaned children", "count", n)
	}
	c.sweepPatches(ctx)
}

// idle reports whether nothing is queued or being reconciled.
func (c *controller) idle() bool { return c.queue.Len() == 0 && c.inFlight.Load() == 0 }

// processNext is the textbook worker step: Get, defer Done, reconcile,
// Forget on success, AddRateLimited on error.
func (c *controller) processNext(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !c.e.held() {
		c.queue.AddAfter(key, holdWait)
		return true
	}
	d := TriggerDigest(key)
	if !c.begin(d, cancel) {
		// Queued before this replica's shard lost it: its new owner
		// reconciles it.
		c.queue.Forget(key)
		return true
	}
	defer c.end(d)
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	start := time.Now()
	err := c.reconcile(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("trigger", key.String())), key)
	result := "success"
	if err != nil {
		result = "error"
	}
	c.e.metrics.ReconcileDone(c.rule.Name, result, time.Since(start))
	c.reconciles.Add(1)
	if err == nil {
		c.queue.Forget(key)
		return true
	}
	logger := klog.FromContext(ctx)
	if c.e.plan != nil {
		if !rules.OnlyConflicts(err) { // conflicts are lines of the plan
			c.e.plan.Failed(c.rule.Name, key.String(), err)
		}
		if c.e.onePass {
			c.queue.Forget(key)
			return true
		}
	}
	if max := c.rule.MaxRetries; max > 0 && c.queue.NumRequeues(key) >= max-1 {
		logger.Error(err, "Giving up on trigger after retries", "trigger", key.String(), "retries", max)
		c.queue.Forget(key)
		return true
	}
	logger.Error(err, "Reconcile failed, retrying with backoff", "trigger", key.String())
	if c.e.owns(c.rule.Name, key) {
		c.queue.AddRateLimited(key)
	}
	return true
}
