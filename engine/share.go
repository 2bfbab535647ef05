package engine

import (
	"context"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// Sharded replicas cache only their share of the triggers and the
// children of those: every other trigger and child is dropped as it is
// decoded (WatchKey.Filter), so that what N replicas cache adds up to
// what one replica would. A rule's trigger and child informers are its
// own (WatchKey.Filter names the rule), and the Registry asks keep, as
// each object arrives, whether to cache it.
//
// The caches are then complete only for the triggers kept without a
// break since they listed: an object kept now and not a moment ago may
// exist and not be cached. A trigger missing from the cache reads as
// deleted, its children as orphans to prune, so the loop never reads what
// may be incomplete:
//   - What the caches keep widens only when the triggers this replica
//     owns do (a replica left: the others gain its share), and the engine
//     notes it then (SetShard: widened). Until the loop's informers have
//     listed again (refresh), its reconciles wait in the queue and it
//     releases no patch (complete).
//   - While SetShard waits for the reconciles of triggers it takes away,
//     the caches keep both shares (keepShard is their union), so that no
//     reconcile under way loses its trigger or children from the cache.
//     The old share is let go of once they have drained.
//   - When what the caches keep narrows, the loop drops what it no longer
//     keeps in place, without a request (Subscription.Drop).
//
// While a rule rolls a change out, its informers keep every object: the
// replica that steps the rollout judges the health of triggers other
// replicas reconcile from its caches.

// The roles of a filtered informer, in WatchKey.Filter.
const (
	filterTriggers = "triggers/"
	filterChildren = "children/"
)

// keeps reports whether s keeps trigger key of rule (every trigger
// without a shard).
func keeps(s Shard, rule string, key cache.ObjectName) bool {
	return s == nil || s.Keeps(rule, TriggerDigest(key))
}

// bothShards keeps what either of two shards keeps: the caches' shard
// while SetShard drains the reconciles of what the one before had.
type bothShards struct{ a, b Shard }

// union is the shard that keeps what a or b keeps.
func union(a, b Shard) Shard {
	if a == nil || b == nil {
		return nil // every trigger
	}
	return bothShards{a, b}
}

func (u bothShards) Owns(rule string, d uint64) bool {
	return u.a.Owns(rule, d) || u.b.Owns(rule, d)
}

func (u bothShards) Keeps(rule string, d uint64) bool {
	return u.a.Keeps(rule, d) || u.b.Keeps(rule, d)
}

func (u bothShards) KeepsWithin(then Shard) bool { return within(u, then) }

// Held and Pending: a union is what the caches keep, never the shard a
// reconcile is gated by.
func (u bothShards) Held() bool    { return u.a.Held() && u.b.Held() }
func (u bothShards) Pending() bool { return u.a.Pending() || u.b.Pending() }

// within reports whether now keeps no trigger that then did not; false
// when that cannot be told.
func within(now, then Shard) bool {
	switch {
	case then == nil:
		return true
	case now == nil:
		return false
	}
	if u, ok := now.(bothShards); ok {
		return within(u.a, then) && within(u.b, then)
	}
	if u, ok := then.(bothShards); ok {
		return within(now, u.a) || within(now, u.b)
	}
	return now.KeepsWithin(then)
}

// filters reports whether the engine's rules filter their caches:
// replicas share the triggers, and it is no dry run (which reads
// everything once).
func (e *Engine) filters() bool { return e.share.filtering }

// keep implements dynamic.Registry.Keep: an object is kept unless its
// rule filters right now and its trigger (for a child, the trigger its
// owner annotation names) is not this replica's to keep.
func (e *Engine) keep(key dynamic.WatchKey, m metav1.Object) bool {
	role, rule, _ := strings.Cut(key.Filter, "/")
	v, ok := e.share.loops.Load(rule)
	if !ok {
		return true
	}
	l := v.(*ruleLoop)
	if l.keepsAll() {
		return true
	}
	trigger := cache.ObjectName{Namespace: m.GetNamespace(), Name: m.GetName()}
	if role+"/" == filterChildren {
		if trigger, ok = l.ownTrigger(rules.Annotation(m, rules.AnnotationOwner)); !ok {
			return true // not the rule's to judge: its reconciles never read it
		}
	}
	e.share.mu.RLock()
	s := e.share.keep
	e.share.mu.RUnlock()
	return keeps(s, rule, trigger)
}

// keepsAll reports whether the loop's informers keep every object: its
// rule is rolling a change out.
func (l *ruleLoop) keepsAll() bool {
	ro := l.ro.Load()
	return ro != nil && !ro.co.Settled()
}

// listing is what a loop's informers keep at a moment: the engine's
// shardGen and widened then, and whether they keep every object.
type listing struct {
	gen, widened uint64
	keepAll      bool
}

func (l *ruleLoop) listingNow() listing {
	l.e.share.mu.RLock()
	defer l.e.share.mu.RUnlock()
	return listing{gen: l.e.share.gen, widened: l.e.share.widened, keepAll: l.keepsAll()}
}

// mustList reports whether caches brought to then may lack objects kept
// at now: now keeps every object and then did not, or what the caches
// keep widened since then (while they keep every object, it does not
// matter; once they do not, every widening since then counts).
func mustList(then, now listing) bool {
	if now.keepAll {
		return !then.keepAll
	}
	return now.widened > then.gen
}

// complete reports whether the loop's caches hold every object they keep
// now, in a loop that filters: no trigger or child it keeps may exist
// uncached. Reconciles and patch releases wait until they do.
func (l *ruleLoop) complete() bool {
	return !l.watches.filter || !mustList(*l.share.listed.Load(), l.listingNow())
}

// Cached counts, for each rule whose informers filter (sharding), the
// objects its trigger and child caches hold. Rules that do not filter are
// left out.
func (e *Engine) Cached() map[string]int {
	e.set.mu.Lock()
	loops := make([]*ruleLoop, 0, len(e.set.loops))
	for _, l := range e.set.loops {
		loops = append(loops, l)
	}
	e.set.mu.Unlock()
	out := map[string]int{}
	for _, l := range loops {
		if !l.watches.filter || l.triggerSub.Load() == nil {
			continue // not subscribed yet: the watches are not to be read
		}
		n := 0
		for _, s := range l.filtered() {
			n += len(s.Indexer().ListKeys())
		}
		out[l.rule.Name] = n
	}
	return out
}

// filtered are the informers of the loop that filter: its triggers' and
// its children's (those of the revision a rollout moves from are the
// same).
func (l *ruleLoop) filtered() []informer {
	if !l.watches.filter {
		return nil
	}
	subs := []informer{l.watches.trigger}
	for _, ck := range l.watches.children {
		if ck.sub != nil {
			subs = append(subs, ck.sub)
		}
	}
	return subs
}

// refresh brings the loop's filtered informers to what the shard keeps
// now, if that changed since they were last brought to it: when it may
// keep a trigger they did not (mustList), they list again; when it only
// keeps less, what it keeps no more is dropped in place, without a
// request. It reports false when ctx ended first; a list that fails is
// tried again after refreshRetry, the informers before it serving
// meanwhile (and the loop's reconciles waiting).
func (l *ruleLoop) refresh(ctx context.Context) bool {
	now, then := l.listingNow(), *l.share.listed.Load()
	if !l.watches.filter || now.gen == then.gen && now.keepAll == then.keepAll {
		return true
	}
	logger := klog.FromContext(ctx)
	start := time.Now()
	if !mustList(then, now) {
		n := l.watches.trigger.Drop(nil)
		for _, ck := range l.watches.children {
			if ck.sub != nil {
				n += ck.sub.Drop(l.forget)
			}
		}
		l.share.listed.Store(&now)
		l.drops.Add(1)
		logger.V(1).Info("Shard changed: dropped what it keeps no more", "objects", n, "took", time.Since(start).Round(time.Millisecond))
		return true
	}
	for _, s := range l.filtered() {
		if err := s.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return false
			}
			logger.Error(err, "Listing again for the shard changed; trying again", "watch", s.Key().String(), "after", refreshRetry)
			time.AfterFunc(refreshRetry, l.poke)
			return true
		}
	}
	l.share.listed.Store(&now)
	l.synced()
	l.refreshes.Add(1)
	logger.V(1).Info("Shard changed: listed again", "took", time.Since(start).Round(time.Millisecond), "keepAll", now.keepAll)
	return true
}

// refreshRetry is how long a refresh that failed waits to be tried again.
const refreshRetry = 5 * time.Second

// poke makes the loop look at its shard again (resharded).
func (l *ruleLoop) poke() {
	select {
	case l.share.reshard <- struct{}{}:
	default: // one pending is enough: it reads the newest shard
	}
}

// waitForShard waits, in a loop that filters, until the engine's shard is
// no placeholder; false when ctx ended first.
func (l *ruleLoop) waitForShard(ctx context.Context) bool {
	for s := l.e.currentShard(); l.watches.filter && s != nil && s.Pending(); s = l.e.currentShard() {
		l.setState(StateSyncing, "waiting for this replica's share of the triggers")
		select {
		case <-l.share.reshard:
		case <-ctx.Done():
			return false
		}
	}
	return true
}
