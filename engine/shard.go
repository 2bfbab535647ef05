package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
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
}

// A Holder is a Shard that can tell whether this replica still holds its
// share: while Held reports false — its Lease not renewed lately — the
// engine starts no reconcile; triggers wait in their queues, none is
// dropped.
type Holder interface {
	Held() bool
}

// holdWait is how long a trigger waits while the shard is not held.
const holdWait = 500 * time.Millisecond

// TriggerDigest is the digest of a trigger's key (namespace/name): the
// first 8 bytes of its SHA-256.
func TriggerDigest(key cache.ObjectName) uint64 {
	sum := sha256.Sum256([]byte(key.String()))
	return binary.BigEndian.Uint64(sum[:8])
}

// owns reports whether the engine's shard owns trigger key of rule (all
// triggers without a shard).
func (e *Engine) owns(rule string, key cache.ObjectName) bool {
	e.shardMu.RLock()
	defer e.shardMu.RUnlock()
	return e.shard == nil || e.shard.Owns(rule, TriggerDigest(key))
}

// held reports whether the engine's shard, if it is a Holder, is held.
func (e *Engine) held() bool {
	h, ok := e.currentShard().(Holder)
	return !ok || h.Held()
}

func (e *Engine) currentShard() Shard {
	e.shardMu.RLock()
	defer e.shardMu.RUnlock()
	return e.shard
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
	e.shardMu.Lock()
	e.shard = s
	e.setKeepLocked(union(e.keepShard, s))
	gen := e.shardGen
	now := time.Now()
	e.shards = append(e.shards, shardChange{s: s, at: now})
	// Keep the changes of the verifying period and the shard in force
	// before them.
	for len(e.shards) > 1 && !e.shards[1].at.After(now.Add(-handoverVerify)) {
		e.shards = e.shards[1:]
	}
	e.shardMu.Unlock()
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
			e.shardMu.Lock()
			if e.shardGen == gen {
				e.setKeepLocked(s)
			}
			e.shardMu.Unlock()
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
	e.shardGen++
	if !within(k, e.keepShard) {
		e.widened = e.shardGen
	}
	e.keepShard = k
}

// pokeLoops makes every loop look at the shard again, and returns them.
func (e *Engine) pokeLoops() []*ruleLoop {
	// Apply holds mu while it stops loops: once it is ours, no loop
	// outside the map is still reconciling.
	e.mu.Lock()
	loops := make([]*ruleLoop, 0, len(e.loops))
	for _, l := range e.loops {
		loops = append(loops, l)
	}
	e.mu.Unlock()
	for _, l := range loops {
		l.poke()
	}
	return loops
}

// Owned is how many of each rule's triggers this replica owns: all of them
// without a shard. Rules whose triggers are not listed yet count none.
func (e *Engine) Owned() map[string]int {
	s := e.currentShard()
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.loops))
	for name, l := range e.loops {
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
	e.shardMu.RLock()
	defer e.shardMu.RUnlock()
	since := time.Time{}
	for i := len(e.shards) - 1; i >= 0 && e.shards[i].s.Owns(rule, d); i-- {
		since = e.shards[i].at
		if i == 0 && len(e.shards) > 1 {
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
	l.mu.Lock()
	synced := l.syncedAt
	l.mu.Unlock()
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
	l.e.shardMu.RLock()
	defer l.e.shardMu.RUnlock()
	if s := l.e.shard; s != nil && !s.Owns(l.rule.Name, d) {
		return false
	}
	l.mu.Lock()
	l.working[d] = cancel
	l.mu.Unlock()
	return true
}

func (l *ruleLoop) end(d uint64) {
	l.mu.Lock()
	delete(l.working, d)
	l.mu.Unlock()
}

// workingLost counts the triggers worked on that s does not own,
// cancelling their requests when cancel is true.
func (l *ruleLoop) workingLost(s Shard, cancel bool) int {
	if s == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for d, stop := range l.working {
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
	before := l.shardSeen
	l.shardSeen = s
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
