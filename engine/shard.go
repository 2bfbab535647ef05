package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Shard limits an engine to the triggers one replica owns, when replicas
// share the triggers (run --sharding). A trigger is known to it by its
// rule and the digest of its key (TriggerDigest); the digest is also what
// names the field manager of the trigger's patches, so that what the sweep
// finds of a trigger that is gone has the owner the trigger had.
type Shard interface {
	// Owns reports whether this replica may reconcile the trigger of rule
	// whose key has digest d.
	Owns(rule string, d uint64) bool
	// Keeps reports whether the trigger is one this replica will own
	// once a handover under way ends — every one it owns now among them:
	// the filtered caches keep those, owned yet or not, so that the
	// handover's end makes the replica list nothing again (share.go). A
	// shard with no handover under way keeps what it owns.
	Keeps(rule string, d uint64) bool
	// KeepsWithin reports whether it keeps no trigger that then did not;
	// false when it cannot tell (the caches then list again).
	KeepsWithin(then Shard) bool
	// Held reports whether this replica still holds its share: while it
	// is false — its Lease not renewed lately — the engine starts no
	// reconcile; triggers wait in their queues, none is dropped.
	Held() bool
	// Pending reports whether the shard is a placeholder: the replica has
	// not been given its share yet (sharding's first assignment, before
	// it joined). Rules that filter wait for a real one before they
	// list, rather than list nothing and again once it comes.
	Pending() bool
}

// holdWait is how long a trigger waits while the shard is not held.
const holdWait = 500 * time.Millisecond

// TriggerDigest is the digest of a trigger's key (namespace/name): the
// first 8 bytes of its SHA-256.
func TriggerDigest(key cache.ObjectName) uint64 {
	sum := sha256.Sum256([]byte(key.String()))
	return binary.BigEndian.Uint64(sum[:8])
}

// shares is the engine's share of the triggers when replicas share them:
// the shard in force and the recent ones, and what the filtered caches
// keep (share.go).
type shares struct {
	mu      sync.RWMutex // guards the fields down to widened; SetShard holds it to change them
	current Shard
	history []shardChange // recent shards, oldest first (see ownedSince)
	// keep is what the filtered caches keep: current, or while SetShard
	// drains, the union of current and the shard before.
	keep    Shard
	gen     uint64 // changes of keep so far
	widened uint64 // the gen of keep's last widening
	// filtering: the engine was made with a shard, and is no dry run
	// (which reads everything once): its rules' informers cache only its
	// share, and loops are the loops running, by rule, for keep.
	filtering bool
	loops     sync.Map
}

// init makes sh the share of an engine made with shard s (nil: every
// trigger); filter says whether its caches may keep only their share.
func (sh *shares) init(s Shard, filter bool) {
	sh.current, sh.keep, sh.filtering = s, s, s != nil && filter
	if s != nil {
		sh.history = []shardChange{{s: s, at: time.Now()}}
	}
}

// owns reports whether the engine's shard owns trigger key of rule (all
// triggers without a shard).
func (e *Engine) owns(rule string, key cache.ObjectName) bool {
	e.share.mu.RLock()
	defer e.share.mu.RUnlock()
	return e.share.current == nil || e.share.current.Owns(rule, TriggerDigest(key))
}

// held reports whether the engine's shard, if it is a Holder, is held.
func (e *Engine) held() bool {
	s := e.currentShard()
	return s == nil || s.Held()
}

func (e *Engine) currentShard() Shard {
	e.share.mu.RLock()
	defer e.share.mu.RUnlock()
	return e.share.current
}

// SetShard makes s the engine's shard. Triggers s does not own are not
// queued or reconciled from now on; SetShard waits until the reconciles of
// those under way have finished — cancelling their requests after the drain
// timeout — so that when it returns this replica writes nothing for them.
// Until then the filtered caches keep what either shard keeps, and after,
// what s keeps (share.go). The triggers s owns and the shard before did
// not are queued, and every rule sweeps again for orphans among them.
// SetShard is not called again before it has returned.
func (e *Engine) SetShard(ctx context.Context, s Shard) {
	e.share.mu.Lock()
	e.share.current = s
	e.setKeepLocked(union(e.share.keep, s))
	gen := e.share.gen
	now := time.Now()
	e.share.history = append(e.share.history, shardChange{s: s, at: now})
	// Keep the changes of the verifying period and the shard in force
	// before them.
	for len(e.share.history) > 1 && !e.share.history[1].at.After(now.Add(-handoverVerify)) {
		e.share.history = e.share.history[1:]
	}
	e.share.mu.Unlock()
	loops := e.pokeLoops()
	deadline := time.Now().Add(e.drain)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		lost := 0
		for _, l := range loops {
			lost += l.workingLost(s, time.Now().After(deadline))
		}
		if lost == 0 {
			// Drained: the caches let go of the old share.
			e.share.mu.Lock()
			if e.share.gen == gen {
				e.setKeepLocked(s)
			}
			e.share.mu.Unlock()
			e.pokeLoops()
			return
		}
		select {
		case <-ctx.Done():
			klog.FromContext(ctx).Info("Stopped waiting for reconciles of triggers handed over", "inFlight", lost)
			return
		case <-tick.C:
		}
	}
}

// setKeepLocked makes k what the filtered caches keep, noting a widening:
// k may keep a trigger the shard before did not. shardMu is held.
func (e *Engine) setKeepLocked(k Shard) {
	e.share.gen++
	if !within(k, e.share.keep) {
		e.share.widened = e.share.gen
	}
	e.share.keep = k
}

// pokeLoops makes every loop look at the shard again, and returns them.
func (e *Engine) pokeLoops() []*ruleLoop {
	// Those stopping too: their reconciles under way are waited for.
	loops := e.allLoops()
	for _, l := range loops {
		l.poke()
	}
	return loops
}

// Owned is how many of each rule's triggers this replica owns: all of them
// without a shard. Rules whose triggers are not listed yet count none.
func (e *Engine) Owned() map[string]int {
	s := e.currentShard()
	e.set.mu.Lock()
	defer e.set.mu.Unlock()
	out := make(map[string]int, len(e.set.loops))
	for name, l := range e.set.loops {
		sub := l.triggerSub.Load()
		if sub == nil {
			out[name] = 0
			continue
		}
		keys := (*sub).Indexer().ListKeys()
		if s == nil {
			out[name] = len(keys)
			continue
		}
		n := 0
		for _, k := range keys {
			if key, err := cache.ParseObjectName(k); err == nil && s.Owns(name, TriggerDigest(key)) {
				n++
			}
		}
		out[name] = n
	}
	return out
}

// shardChange is a shard and when the engine took it.
type shardChange struct {
	s  Shard
	at time.Time
}

// ownedSince is when the shards began to own the trigger of rule with
// digest d without a break since; zero without a shard, or when it was
// owned before the shards the engine remembers (handoverVerify).
func (e *Engine) ownedSince(rule string, d uint64) time.Time {
	e.share.mu.RLock()
	defer e.share.mu.RUnlock()
	since := time.Time{}
	for i := len(e.share.history) - 1; i >= 0 && e.share.history[i].s.Owns(rule, d); i-- {
		since = e.share.history[i].at
		if i == 0 && len(e.share.history) > 1 {
			since = time.Time{} // in force before the period remembered
		}
	}
	return since
}

// mayLag reports whether this replica's child caches may lack a write the
// previous owner of trigger key made: it gained the trigger less than
// handoverVerify ago, or its informers synced less than that after it did.
func (l *ruleLoop) mayLag(key cache.ObjectName) bool {
	since := l.e.ownedSince(l.rule.Name, TriggerDigest(key))
	if since.IsZero() {
		return false
	}
	l.phase.mu.Lock()
	synced := l.phase.syncedAt
	l.phase.mu.Unlock()
	return time.Since(since) < handoverVerify || (synced.After(since) && time.Since(synced) < handoverVerify)
}

// add queues trigger key if this replica owns it.
func (l *ruleLoop) add(key cache.ObjectName) {
	if l.e.owns(l.rule.Name, key) {
		l.queue.Add(key)
	}
}

// begin marks the trigger whose key has digest d as being worked on, with
// cancel to stop its requests, if this replica owns it; the check and the
// mark are one step for SetShard, which waits for the work on the triggers
// it takes away.
func (l *ruleLoop) begin(d uint64, cancel context.CancelFunc) bool {
	l.e.share.mu.RLock()
	defer l.e.share.mu.RUnlock()
	if s := l.e.share.current; s != nil && !s.Owns(l.rule.Name, d) {
		return false
	}
	l.share.mu.Lock()
	l.share.working[d] = cancel
	l.share.mu.Unlock()
	return true
}

func (l *ruleLoop) end(d uint64) {
	l.share.mu.Lock()
	delete(l.share.working, d)
	l.share.mu.Unlock()
}

// workingLost counts the triggers worked on that s does not own,
// cancelling their requests when cancel is true.
func (l *ruleLoop) workingLost(s Shard, cancel bool) int {
	if s == nil {
		return 0
	}
	l.share.mu.Lock()
	defer l.share.mu.Unlock()
	n := 0
	for d, stop := range l.share.working {
		if !s.Owns(l.rule.Name, d) {
			n++
			if cancel {
				stop()
			}
		}
	}
	return n
}

// handoverVerify is how long after gaining a trigger — or after its
// informers synced, if later — a replica reads a child it does not find in
// its cache from the API server before applying it. The replica that had
// the trigger may have written the child just before letting it go, and
// this replica's child cache can be a watch behind (milliseconds as a rule;
// longer while an informer catches up after its list). Applying at once
// would send the same content by the same field manager again: stored as
// no change, but a request. The read is consistent, so what the previous
// owner wrote before it published its view is always found.
const handoverVerify = 10 * time.Second

// resharded queues the triggers the engine's shard owns that the one
// before did not, and sweeps for orphans among them. It runs on the
// loop's goroutine.
func (l *ruleLoop) resharded(ctx context.Context) {
	if !l.refresh(ctx) {
		return
	}
	s := l.e.currentShard()
	before := l.share.seen
	l.share.seen = s
	n := 0
	for _, k := range l.watches.trigger.Indexer().ListKeys() {
		key, err := cache.ParseObjectName(k)
		if err != nil {
			continue
		}
		d := TriggerDigest(key)
		if (s == nil || s.Owns(l.rule.Name, d)) && before != nil && !before.Owns(l.rule.Name, d) {
			l.queue.Add(key)
			n++
		}
	}
	klog.FromContext(ctx).V(1).Info("Shard changed: queued the triggers gained", "count", n)
	// Orphans of the triggers gained: children of triggers deleted while
	// another replica owned them.
	l.sweep(ctx)
}
