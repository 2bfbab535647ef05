package engine

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// A rule's loop is in one of these states (RuleState.State).
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
// label): a child informer (childKey) never sees another installation's
// children.
func childrenSelector(installation string) string {
	if installation == "" {
		return rules.LabelManagedBy + "=" + rules.ManagedByValue + ",!" + rules.LabelInstallation
	}
	return rules.LabelManagedBy + "=" + rules.ManagedByValue + "," + rules.LabelInstallation + "=" + installation
}

// TriggerChildren selects the children rule r made for the trigger of
// uid: what `syncloop trace` lists.
func TriggerChildren(r *rules.Rule, uid string) string {
	return childrenSelector(r.Installation) + "," + rules.LabelRule + "=" + r.Name + "," + rules.LabelOwnerUID + "=" + uid
}

// ruleLoop is one rule's control loop: it resolves and watches the rule's
// kinds, turns events into trigger keys on a rate-limited workqueue, runs
// the rule's workers over it, resyncs and sweeps for orphans, and keeps to
// the triggers its replica's shard owns. What one trigger's reconcile does
// is the reconciler's (reconcile.go); the loop only decides when.
type ruleLoop struct {
	e      *Engine
	rule   *rules.Rule
	bad    error // the rule cannot run at all: its identity cannot be had
	queue  workqueue.TypedRateLimitingInterface[cache.ObjectName]
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned

	watches *watches    // resolved and subscribed by run before any worker starts
	rc      *reconciler // reconciles one trigger
	own     []*reconciler
	// fleet are the clusters the rule's children may go to; nil when no
	// resource of the rule targets clusters.
	fleet *loopFleet
	// ro is the rule's rollout from its previous revision, if one is
	// under way (or was, since the loop started): nil, every trigger is
	// on the loop's revision.
	ro atomic.Pointer[rollingOut]

	loopCounters
	phase loopPhase
	share loopShare
	// released retries the sweep's releases that failed (run's goroutine).
	released backoff
}

// loopPhase is where a loop is: its state, why, and since when its
// informers have synced.
type loopPhase struct {
	mu       sync.Mutex
	state    string
	detail   string
	syncedAt time.Time // when the informers the workers need had synced
}

// loopShare is a loop's side of sharding (shard.go, share.go).
type loopShare struct {
	// reshard signals a new shard (SetShard); seen is the shard the loop
	// last queued triggers for (run's goroutine only).
	reshard chan struct{}
	seen    Shard
	// listed is what the filtered informers were last brought to keep
	// (refresh; written on run's goroutine, read by workers).
	listed atomic.Pointer[listing]

	mu sync.Mutex // guards working
	// working are the triggers being reconciled or released, by key
	// digest, each with the cancel of its requests (see SetShard).
	working map[uint64]context.CancelFunc
}

// backoff schedules a retry after a failure, doubling the wait from
// backoffFirst to backoffMax while failures go on. Not safe for
// concurrent use.
type backoff struct {
	delay time.Duration
	timer *time.Timer
}

const (
	backoffFirst = time.Second
	backoffMax   = 5 * time.Minute
)

// after notes how an attempt went: a failure schedules the next.
func (b *backoff) after(failed bool) {
	if !failed {
		b.delay = 0
		return
	}
	b.delay = min(max(2*b.delay, backoffFirst), backoffMax)
	if b.timer == nil {
		b.timer = time.NewTimer(b.delay)
		return
	}
	b.timer.Reset(b.delay)
}

// due fires when the retry is due; nil while none is scheduled.
func (b *backoff) due() <-chan time.Time {
	if b.timer == nil {
		return nil
	}
	return b.timer.C
}

func (b *backoff) stop() {
	if b.timer != nil {
		b.timer.Stop()
	}
}

// loopCounters count what a loop did, for tests and diagnostics.
type loopCounters struct {
	resyncs    atomic.Int64 // resync passes done
	reconciles atomic.Int64 // reconciles finished
	inFlight   atomic.Int64 // keys taken from the queue and not done yet
	// triggerSub is the trigger informer once subscribed, for Owned.
	triggerSub atomic.Pointer[store]
	refreshes  atomic.Int64 // filtered informers listed again (refresh)
	drops      atomic.Int64 // filtered informers dropped from in place (refresh)
	holds      atomic.Int64 // reconciles put off: the caches may be incomplete
}

// newRuleLoop makes the loop of rule r. retired are kinds an earlier
// version of the rule made and r does not: their children are pruned.
// retiredPatches are the patch watches of earlier versions: what they
// patched and r does not is released.
func newRuleLoop(e *Engine, r *rules.Rule, retired []schema.GroupVersionKind, retiredPatches []*patchWatch, plan *rollout.Plan) *ruleLoop {
	limiter := workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](r.RateLimit.BaseDelay, r.RateLimit.MaxDelay),
		&workqueue.TypedBucketRateLimiter[cache.ObjectName]{Limiter: rate.NewLimiter(rate.Limit(r.RateLimit.QPS), r.RateLimit.Burst)},
	)
	a, err := e.actors.of(r.Identity)
	if err != nil {
		a, _ = e.actors.of(rules.ServiceAccount{}) // never used: the loop fails
	}
	l := &ruleLoop{
		e:    e,
		rule: r,
		bad:  err,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter,
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: r.Name, MetricsProvider: e.queues}),
		done:    make(chan struct{}),
		watches: &watches{rule: r, ns: cmp.Or(e.ns, r.Tenant), actor: a, retired: retired, retiredPatches: retiredPatches, filter: e.filters()},
		phase:   loopPhase{state: StateWaiting},
		share:   loopShare{reshard: make(chan struct{}, 1), working: map[uint64]context.CancelFunc{}},
	}
	if f := e.actors.fleet; r.TargetsClusters() && f != nil {
		l.fleet = newLoopFleet(l, f)
	}
	l.rc = l.reconcilerOf(r, l.watches)
	l.own = []*reconciler{l.rc}
	if plan != nil {
		l.ro.Store(newRollingOut(l, plan))
		l.rc.observe = func(key cache.ObjectName, rd *render.Rendered, err error) {
			if ro := l.ro.Load(); ro != nil {
				ro.co.Observe(key, healthOf(rd, err))
			}
		}
	}
	return l
}

// reconcilerOf is the reconciler of rule r, the loop's or the one a
// rollout moves from, reading w's caches: it acts as the rule's identity
// and queues its triggers on the loop's queue.
func (l *ruleLoop) reconcilerOf(r *rules.Rule, w *watches) *reconciler {
	e, client := l.e, w.actor.client
	var scoper render.Scoper = e.mapper
	if l.fleet != nil {
		scoper = FleetScoper(e.mapper, r, l.fleet.mappers)
	}
	rc := newReconciler(r, w, scoper, client, e.metrics, e.fights, func(writes *ownWrites) writer {
		return e.out.writer(r, "", client, writes, l.add)
	})
	rc.mayLag = l.mayLag
	rc.fleet = l.fleet
	rc.later = func(key cache.ObjectName, d time.Duration) {
		if e.owns(l.rule.Name, key) {
			l.queue.AddAfter(key, d)
		}
	}
	return rc
}

func (l *ruleLoop) start(ctx context.Context) {
	ctx, l.cancel = context.WithCancel(ctx)
	go func() {
		defer close(l.done)
		defer func() {
			// Only a panic outside the contained units — in starting the
			// rule, say — gets here: the rule is failed until it changes.
			if v := recover(); v != nil {
				pe := contained(klog.FromContext(ctx), l.e.metrics, l.rule.Name, PanicLoop, v)
				l.setState(StateFailed, pe.Error())
			}
		}()
		l.run(ctx)
	}()
}

// stop cancels the loop and waits until it has drained and stopped.
func (l *ruleLoop) stop() {
	l.cancel()
	<-l.done
}

func (l *ruleLoop) setState(state, detail string) {
	l.phase.mu.Lock()
	l.phase.state, l.phase.detail = state, detail
	l.phase.mu.Unlock()
}

func (l *ruleLoop) getState() (string, string) {
	l.phase.mu.Lock()
	defer l.phase.mu.Unlock()
	return l.phase.state, l.phase.detail
}

// run is the loop's life: resolve kinds (waiting while one is not served),
// subscribe to informers, wait for those the workers need to sync, work
// while the triggers list, sweep for orphans once they have, then resync,
// follow shard changes and work until ctx ends, and drain.
func (l *ruleLoop) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	defer l.watches.unsubscribe()
	defer func() {
		if ro := l.ro.Load(); ro != nil {
			ro.from.w.unsubscribe()
		}
	}()
	defer l.queue.ShutDown()
	if l.watches.filter {
		l.e.share.loops.Store(l.rule.Name, l)
		defer l.e.share.loops.CompareAndDelete(l.rule.Name, l)
	}
	if !l.waitForShard(ctx) {
		return
	}
	l.share.seen = l.e.currentShard()
	listed := l.listingNow()
	l.share.listed.Store(&listed)
	if !l.prepare(ctx) || !l.prepareRollout(ctx) {
		return
	}
	stopFleet, ok := l.startFleet(ctx)
	defer stopFleet()
	if !ok || !l.waitForSync(ctx, l.needed()) {
		return
	}
	l.synced()

	// Workers get a context that outlives ctx by the drain timeout, so
	// that in-flight reconciles finish on shutdown. They start before the
	// triggers have listed: each is reconciled as it arrives (a reconcile
	// whose trigger has not arrived yet does nothing).
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var wg sync.WaitGroup
	for range l.rule.Workers {
		wg.Go(func() {
			for l.processNext(workCtx) {
			}
		})
	}
	go l.step(ctx, l.afterRetiredPatches)
	if l.waitForSync(ctx, []informer{l.watches.trigger}) {
		l.step(ctx, l.sweep) // children whose trigger went away while syncloop was down
		l.setState(StateRunning, "")
		logger.Info("Rule running", "workers", l.rule.Workers)
		if ro := l.ro.Load(); ro != nil {
			go ro.co.Run(ctx)
		}
	}

	var tick <-chan time.Time
	if l.rule.ResyncPeriod > 0 {
		t := time.NewTicker(l.rule.ResyncPeriod)
		defer t.Stop()
		tick = t.C
	}
	defer l.released.stop()
	for {
		select {
		case <-tick:
			l.step(ctx, l.resync)
			continue
		case <-l.released.due():
			l.step(ctx, l.sweepPatches)
			continue
		case <-l.share.reshard:
			l.step(ctx, l.resharded)
			continue
		case <-ctx.Done():
		}
		break
	}
	logger.V(1).Info("Rule stopping: draining its queue")
	timer := time.AfterFunc(l.e.drain, cancelWork)
	defer timer.Stop()
	l.queue.ShutDownWithDrain()
	wg.Wait()
}

// synced records that the informers the workers need have synced, now.
func (l *ruleLoop) synced() {
	l.phase.mu.Lock()
	l.phase.syncedAt = time.Now()
	l.phase.mu.Unlock()
}

// prepare resolves the rule's kinds, checks them against the engine's
// namespace and subscribes to the informers; false when the rule cannot
// run (its state says why) or ctx ended.
func (l *ruleLoop) prepare(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	waiting := func(err error) {
		l.setState(StateWaiting, err.Error())
		logger.Info("Rule waiting for a kind the API server does not serve", "err", err)
	}
	if l.bad != nil {
		logger.Error(l.bad, "Rule cannot run")
		l.setState(StateFailed, l.bad.Error())
		return false
	}
	if !l.watches.resolve(ctx, l.e.mapper, waiting) {
		return false
	}
	if err := l.watches.checkNamespace(); err != nil {
		logger.Error(err, "Rule cannot run")
		l.setState(StateFailed, err.Error())
		return false
	}
	l.setState(StateSyncing, "")
	if err := l.watches.subscribe(ctx, l.handlers(ctx)); err != nil {
		logger.Error(err, "Cannot watch")
		l.setState(StateWaiting, err.Error())
		return false
	}
	triggers := store(l.watches.trigger)
	l.triggerSub.Store(&triggers)
	return true
}

// prepareRollout resolves and subscribes the watches of the revision a
// rollout moves from. When they cannot be had soon — a kind it used is no
// longer served — the rollout is given up: every trigger moves at once.
// It returns false only when ctx ended.
func (l *ruleLoop) prepareRollout(ctx context.Context) bool {
	ro := l.ro.Load()
	if ro == nil {
		return true
	}
	logger := klog.FromContext(ctx)
	w := ro.from.w
	rctx, cancel := context.WithTimeout(ctx, rolloutResolveWait)
	defer cancel()
	var why error
	if !w.resolve(rctx, l.e.mapper, func(err error) { why = err }) {
		if ctx.Err() != nil {
			return false
		}
		l.giveUpRollout(ctx, fmt.Errorf("the revision it rolls out from cannot be watched: %w", why))
		return true
	}
	if err := w.checkNamespace(); err != nil {
		l.giveUpRollout(ctx, err)
		return true
	}
	h := l.handlersOf(ctx, ro.from, false)
	h.skip = l.watches.childKeys()
	if err := w.subscribe(ctx, h); err != nil {
		w.unsubscribe()
		l.giveUpRollout(ctx, err)
		return true
	}
	logger.Info("Rolling out a change of the rule", "from", rollout.Short(ro.co.Record().From), "to", rollout.Short(l.rule.Hash), "settings", l.rule.Rollout.String())
	return true
}

// rolloutResolveWait bounds how long a rollout waits for the kinds of the
// revision it moves from.
const rolloutResolveWait = 10 * time.Second

// giveUpRollout ends the loop's rollout before it began: every trigger is
// on the loop's revision.
func (l *ruleLoop) giveUpRollout(ctx context.Context, why error) {
	klog.FromContext(ctx).Error(why, "Cannot roll the change out in steps: every trigger moves at once")
	l.ro.Store(nil)
	l.poke() // informers that filter drop what is not the shard's again
}

// needed are the informers the workers need synced: the rule's, and
// during a rollout those of the revision it moves from.
func (l *ruleLoop) needed() []informer {
	subs := l.watches.needed()
	if ro := l.ro.Load(); ro != nil {
		subs = append(subs, ro.from.w.needed()...)
	}
	return subs
}

// waitForSync waits until the informers of subs have synced, and reports
// false if ctx ends first. While one has not, the rule's detail says why —
// a list or watch the API server refused (missing RBAC) or could not
// answer — and each new reason is logged once; the informers retry with
// backoff meanwhile.
func (l *ruleLoop) waitForSync(ctx context.Context, subs []informer) bool {
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
				l.setState(StateSyncing, detail)
				if failing && detail != logged {
					logged = detail
					klog.FromContext(ctx).Error(nil, "Rule cannot start: its informers cannot sync", "reason", detail)
				}
			}
		}
	}
	return true
}

// cannotSync begins the detail of a rule whose informers' lists or
// watches fail (RBAC, an API server that does not answer).
const cannotSync = "cannot list and watch "

// syncDetail says why subs have not all synced, and whether because a
// list or watch fails.
func syncDetail(subs []informer) (detail string, failing bool) {
	for _, s := range subs {
		if s.HasSynced() {
			continue
		}
		if err := s.LastError(); err != nil {
			return fmt.Sprintf("%s%s: %v", cannotSync, s.Key(), err), true
		}
		detail = "listing " + s.Key().String()
	}
	return detail, false
}

// resync re-checks every trigger and sweeps for orphans.
func (l *ruleLoop) resync(ctx context.Context) {
	l.addAll()
	l.sweep(ctx)
	l.resyncs.Add(1)
}

// addAll queues every cached trigger.
func (l *ruleLoop) addAll() {
	for _, k := range l.watches.trigger.Indexer().ListKeys() {
		if key, err := cache.ParseObjectName(k); err == nil {
			l.add(key)
		}
	}
}

// sweep queues the trigger of every child of this rule whose trigger is
// not in the cache (or is another object of the same name): its reconcile
// prunes the child. This is how a trigger deleted while syncloop was down
// is cleaned up. What the patches of such triggers hold is released.
func (l *ruleLoop) sweep(ctx context.Context) {
	n := 0
	triggers := l.watches.trigger.Indexer()
	for _, ck := range l.watches.children {
		if ck.sub == nil {
			continue
		}
		objs, err := ck.sub.Indexer().ByIndex(ruleIndex, l.rule.Name)
		if err != nil {
			continue
		}
		for _, o := range objs {
			m, err := meta.Accessor(o)
			if err != nil {
				continue
			}
			key, ok := l.ownTrigger(rules.Annotation(m, rules.AnnotationOwner))
			if !ok {
				continue
			}
			t, exists, _ := triggers.GetByKey(key.String())
			if !exists || string(t.(object).GetUID()) != rules.Label(m, rules.LabelOwnerUID) {
				l.add(key)
				n++
			}
		}
	}
	if n > 0 {
		klog.FromContext(ctx).V(1).Info("Queued triggers of orphaned children", "count", n)
	}
	l.sweepPatches(ctx)
}

// sweepPatches releases what the patch managers of triggers that no
// longer exist own: triggers deleted while syncloop was down. Each is
// released by the replica that owns its trigger (sharding), as work on it
// that a handover waits for. A release that fails is tried again with
// backoff until it succeeds (released), not only at the next resync or
// start: no trigger's reconcile would.
func (l *ruleLoop) sweepPatches(ctx context.Context) {
	if !l.complete() {
		return // a trigger gained may be live and not cached yet: refresh sweeps once it is
	}
	failed := false
	defer func() { l.released.after(failed) }()
	for _, manager := range l.rc.goneManagers() {
		d, ok := managerDigest(manager, patchManagerPrefix(l.rule))
		if !ok {
			continue
		}
		ctx, cancel := context.WithCancel(ctx)
		if l.begin(d, cancel) {
			if err := l.rc.releaseAll(ctx, manager); err != nil {
				failed = true
				klog.FromContext(ctx).Error(err, "Releasing the fields of a trigger that is gone, retrying with backoff")
			}
			l.end(d)
		}
		cancel()
	}
}

// afterRetiredPatches queues every trigger once the patch watches of the
// rule's earlier versions have synced (the rule does not wait for them: a
// kind may be gone): each reconcile then releases what its trigger patched
// through a resource the rule no longer has.
func (l *ruleLoop) afterRetiredPatches(ctx context.Context) {
	n := 0
	for _, pw := range l.watches.patches {
		if pw.res == nil && pw.sub != nil {
			if !synced(ctx, pw.sub) {
				return
			}
			n++
		}
	}
	if n > 0 && synced(ctx, l.watches.trigger) {
		l.addAll()
	}
}
