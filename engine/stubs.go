package engine

import (
	"context"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// Sharded replicas cache whole only their share of the triggers (keeps)
// and the children of those; every other trigger and child is a stub
// (dynamic.Stub: its name, uid and resourceVersion), so that what N
// replicas hold whole adds up to one replica's objects. A rule's trigger
// and child informers are its own (WatchKey.Stubs names the rule), and the
// Registry asks keep, as each object arrives, whether to cache it whole.
//
// When the share changes, the loop brings its informers to it (refresh):
// what it lost is stubbed in place; when it gained anything, the informers
// list again. Until the new lists are in, a gained trigger still cached as
// a stub waits in the queue, and a child found as a stub is read from the
// API server. While a rule rolls a change out, its informers keep every
// object whole: the replica that steps the rollout judges the health of
// triggers other replicas reconcile from its caches.

// The roles of a stubbing informer, in WatchKey.Stubs.
const (
	stubsTriggers = "triggers/"
	stubsChildren = "children/"
)

// keeper is a Shard that can say which triggers a replica will own once
// a handover under way ends (sharding's views agree) — every one it owns
// now among them: those are kept whole, owned yet or not, so that the
// handover's end makes the replica list nothing again. A Shard that is no
// keeper keeps what it owns.
type keeper interface {
	Keeps(rule string, d uint64) bool
}

// keeps reports whether s keeps trigger key of rule whole (every trigger
// without a shard).
func keeps(s Shard, rule string, key cache.ObjectName) bool {
	if s == nil {
		return true
	}
	d := TriggerDigest(key)
	if k, ok := s.(keeper); ok {
		return k.Keeps(rule, d)
	}
	return s.Owns(rule, d)
}

// pendingShard is a Shard that may say it is a placeholder: the replica
// has not been given its share yet (sharding's first assignment, before
// the replica joined). Rules that stub wait for a real one before they
// list, rather than list everything as stubs and again once it comes.
type pendingShard interface {
	Pending() bool
}

func pending(s Shard) bool {
	p, ok := s.(pendingShard)
	return ok && p.Pending()
}

// stubs reports whether the engine's rules stub: replicas share the
// triggers, and it is no dry run (which reads everything once).
func (e *Engine) stubs() bool { return e.sharded && e.plan == nil }

// keep implements dynamic.Registry.Keep: an object is kept whole unless
// its rule stubs right now and its trigger (for a child, the trigger its
// owner annotation names) is not this replica's to keep. A child's stub
// notes its owner annotation, so that the loop can tell when it gains the
// child of a trigger that is gone (an orphan its sweep must see whole).
func (e *Engine) keep(key dynamic.WatchKey, u *unstructured.Unstructured) (bool, string) {
	role, rule, _ := strings.Cut(key.Stubs, "/")
	role += "/"
	v, ok := e.stubLoops.Load(rule)
	if !ok {
		return true, ""
	}
	l := v.(*ruleLoop)
	if l.keepsAll() {
		return true, ""
	}
	trigger := cache.ObjectName{Namespace: u.GetNamespace(), Name: u.GetName()}
	note := ""
	if role == stubsChildren {
		// Read in place: GetAnnotations copies the map, on every event.
		note, _, _ = unstructured.NestedString(u.Object, "metadata", "annotations", rules.AnnotationOwner)
		if trigger, ok = l.ownTrigger(note); !ok {
			return true, "" // not the rule's to judge: its reconciles never read it
		}
	}
	return keeps(e.currentShard(), rule, trigger), note
}

// keepsAll reports whether the loop's informers keep every object whole:
// its rule is rolling a change out.
func (l *ruleLoop) keepsAll() bool {
	ro := l.ro.Load()
	return ro != nil && !ro.settled.Load()
}

// listing is what a loop's informers last kept whole under: the shard (and
// its generation) and whether they kept every object whole.
type listing struct {
	gen     uint64
	shard   Shard
	keepAll bool
}

func (l *ruleLoop) listingNow() listing {
	l.e.shardMu.RLock()
	defer l.e.shardMu.RUnlock()
	return listing{gen: l.e.shardGen, shard: l.e.shard, keepAll: l.keepsAll()}
}

// gains reports whether now keeps whole a cached trigger, or a cached
// child's trigger, that was not kept whole under then.
func (l *ruleLoop) gains(then, now listing) bool {
	switch {
	case now.keepAll:
		return !then.keepAll
	case then.keepAll:
		return false
	}
	gained := func(key cache.ObjectName) bool {
		return keeps(now.shard, l.rule.Name, key) && !keeps(then.shard, l.rule.Name, key)
	}
	for _, k := range l.watches.trigger.Indexer().ListKeys() {
		if key, err := cache.ParseObjectName(k); err == nil && gained(key) {
			return true
		}
	}
	for _, ck := range l.watches.children {
		if ck.sub == nil {
			continue
		}
		for _, obj := range ck.sub.Indexer().List() {
			if note := dynamic.StubNote(obj); note != "" {
				if key, ok := l.ownTrigger(note); ok && gained(key) {
					return true
				}
			}
		}
	}
	return false
}

// CachedObjects are the objects of one rule's trigger and child caches:
// how many are whole and how many stubs.
type CachedObjects struct{ Whole, Stubs int }

// Cached counts, for each rule whose informers stub (sharding), the
// objects its caches hold whole and as stubs. Rules that do not stub are
// left out.
func (e *Engine) Cached() map[string]CachedObjects {
	e.mu.Lock()
	loops := make([]*ruleLoop, 0, len(e.loops))
	for _, l := range e.loops {
		loops = append(loops, l)
	}
	e.mu.Unlock()
	out := map[string]CachedObjects{}
	for _, l := range loops {
		if !l.watches.stubs || l.triggerSub.Load() == nil {
			continue // not subscribed yet: the watches are not to be read
		}
		var c CachedObjects
		for _, s := range l.stubbed() {
			for _, obj := range s.Indexer().List() {
				if dynamic.IsStub(obj) {
					c.Stubs++
				} else {
					c.Whole++
				}
			}
		}
		out[l.rule.Name] = c
	}
	return out
}

// stubbed are the informers of the loop that stub: its triggers' and its
// children's (those of the revision a rollout moves from are the same).
func (l *ruleLoop) stubbed() []*dynamic.Subscription {
	if !l.watches.stubs {
		return nil
	}
	subs := []*dynamic.Subscription{l.watches.trigger}
	for _, ck := range l.watches.children {
		if ck.sub != nil {
			subs = append(subs, ck.sub)
		}
	}
	return subs
}

// refresh brings the loop's stubbing informers to what the shard keeps
// whole now, if that changed since they were last brought to it: when a
// trigger is kept whole that was not, they list again; when some are kept
// whole no more and none gained (a replica joined: the others only lose),
// their whole objects are stubbed in place, without a request. It reports
// false when ctx ended first; a list that fails is tried again after
// refreshRetry, the informers before it serving meanwhile.
func (l *ruleLoop) refresh(ctx context.Context) bool {
	now := l.listingNow()
	if !l.watches.stubs || now.gen == l.listed.gen && now.keepAll == l.listed.keepAll {
		return true
	}
	logger := klog.FromContext(ctx)
	start := time.Now()
	if !l.gains(l.listed, now) {
		n := 0
		for _, s := range l.stubbed() {
			n += s.Restub()
		}
		l.listed = now
		l.restubs.Add(1)
		logger.V(1).Info("Shard changed: stubbed what it keeps whole no more", "objects", n, "took", time.Since(start).Round(time.Millisecond))
		return true
	}
	for _, s := range l.stubbed() {
		if err := s.Refresh(ctx); err != nil {
			if ctx.Err() != nil {
				return false
			}
			logger.Error(err, "Listing again for the shard changed; trying again", "watch", s.Key().String(), "after", refreshRetry)
			time.AfterFunc(refreshRetry, l.poke)
			return true
		}
	}
	l.listed = now
	l.mu.Lock()
	l.syncedAt = time.Now()
	l.mu.Unlock()
	l.refreshes.Add(1)
	logger.V(1).Info("Shard changed: listed again", "took", time.Since(start).Round(time.Millisecond), "keepAll", now.keepAll)
	return true
}

// refreshRetry is how long a refresh that failed waits to be tried again.
const refreshRetry = 5 * time.Second

// poke makes the loop look at its shard again (resharded).
func (l *ruleLoop) poke() {
	select {
	case l.reshard <- struct{}{}:
	default: // one pending is enough: it reads the newest shard
	}
}

// whole reports whether the loop may reconcile trigger key now: its cached
// trigger is not a stub (gained, and not listed again yet).
func (l *ruleLoop) whole(key cache.ObjectName) bool {
	if !l.watches.stubs {
		return true
	}
	obj, ok, _ := l.watches.trigger.Indexer().GetByKey(key.String())
	return !ok || !dynamic.IsStub(obj)
}

// waitForShard waits, in a loop that stubs, until the engine's shard is
// no placeholder; false when ctx ended first.
func (l *ruleLoop) waitForShard(ctx context.Context) bool {
	for l.watches.stubs && pending(l.e.currentShard()) {
		l.setState(StateSyncing, "waiting for this replica's share of the triggers")
		select {
		case <-l.reshard:
		case <-ctx.Done():
			return false
		}
	}
	return true
}
