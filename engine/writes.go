package engine

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// ownWrites is what a rule remembers of its own writes, so
// that their echoes cost nothing and nothing is written or deleted twice:
// the version each of its applies returned, the applies under way (with the
// last event seen meanwhile), the deletes the cache has not shown yet, and
// the children whose last apply found an object it may not write. It holds
// no object, and has its own lock: event handlers and workers call it.
type ownWrites struct {
	mu sync.Mutex
	// applied is the resourceVersion syncloop's last apply of a child
	// returned.
	applied map[childRef]string
	// replaced is, for a child syncloop's last apply updated, the version
	// it replaced and the applied-hash it wrote: while the cache still
	// holds that version, it lags behind a write of this very content.
	replaced map[childRef]replacement
	// inflight holds the children being applied, with the resourceVersion
	// of the last event of each seen meanwhile ("": none).
	inflight map[childRef]string
	// deleted are children deleted, by the UID deleted, whose removal the
	// cache has not shown yet.
	deleted map[childRef]types.UID
	// conflicted are, by trigger, the children whose last apply found an
	// object syncloop may not write under their name: the next one reads
	// first. A trigger's entry goes when it wants no children.
	conflicted map[cache.ObjectName]map[childRef]bool
	// unheldKeys are the triggers syncloop took the teardown finalizer
	// off, until the cache no longer holds them.
	unheldKeys map[cache.ObjectName]bool
}

func newOwnWrites() *ownWrites {
	return &ownWrites{applied: map[childRef]string{}, replaced: map[childRef]replacement{}, inflight: map[childRef]string{},
		deleted: map[childRef]types.UID{}, conflicted: map[cache.ObjectName]map[childRef]bool{}, unheldKeys: map[cache.ObjectName]bool{}}
}

// echo reports whether an event carrying ref at version rv needs no
// reconcile: it is the echo of syncloop's own last apply of it, or it came
// while an apply of ref is still returning — held, then: the echo can beat
// the answer, and applyDone decides.
func (w *ownWrites) echo(ref childRef, rv string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, applying := w.inflight[ref]; applying {
		w.inflight[ref] = rv
		return true
	}
	last, ok := w.applied[ref]
	return ok && last == rv
}

// applying marks ref as being applied.
func (w *ownWrites) applying(ref childRef) {
	w.mu.Lock()
	w.inflight[ref] = ""
	w.mu.Unlock()
}

// applyDone ends an apply of ref that returned rv ("" when it failed): rv
// is remembered as syncloop's own. It reports whether an event held during
// the apply was not its echo: the trigger must be reconciled again.
func (w *ownWrites) applyDone(ref childRef, rv string) (missed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := w.inflight[ref]
	delete(w.inflight, ref)
	if rv != "" {
		w.applied[ref] = rv
	}
	return seen != "" && seen != rv
}

// replacement is a version of a child and the content that replaced it.
type replacement struct{ version, hash string }

// replacedWith notes that syncloop's apply of ref, whose cached version was
// version, wrote content of hash.
func (w *ownWrites) replacedWith(ref childRef, version, hash string) {
	w.mu.Lock()
	w.replaced[ref] = replacement{version, hash}
	w.mu.Unlock()
}

// lags reports whether a cached ref at version is the one syncloop's last
// apply replaced with content of hash: the cache has not caught up with a
// write of what is wanted (a reconcile queued by the replay of the old
// version's event, when a changed rule starts), and applying again would
// change nothing.
func (w *ownWrites) lags(ref childRef, version, hash string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.replaced[ref]
	return ok && r.version == version && r.hash == hash
}

// remember notes the resourceVersion an apply of ref that no event is held
// for (a patch, a release) returned.
func (w *ownWrites) remember(ref childRef, rv string) {
	w.mu.Lock()
	w.applied[ref] = rv
	w.mu.Unlock()
}

// isOwnVersion reports whether rv is what syncloop's last apply of ref
// returned.
func (w *ownWrites) isOwnVersion(ref childRef, rv string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.applied[ref]
	return ok && last == rv
}

// deleting notes that ref, as the object with uid, is about to be deleted;
// it reports false when that delete was made already (the cache has not
// caught up). Noted before the request, so that the informer's delete
// event, which may come before the request returns, forgets it.
func (w *ownWrites) deleting(ref childRef, uid types.UID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.deleted[ref] == uid {
		return false
	}
	w.deleted[ref] = uid
	return true
}

// deletedAlready reports whether ref, as the object with uid, was deleted
// and the cache has not shown it.
func (w *ownWrites) deletedAlready(ref childRef, uid types.UID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleted[ref] == uid
}

// deleteFailed undoes deleting: the delete did not happen.
func (w *ownWrites) deleteFailed(ref childRef) {
	w.mu.Lock()
	delete(w.deleted, ref)
	w.mu.Unlock()
}

// deleteDone notes that ref was deleted: no apply of it is syncloop's now.
func (w *ownWrites) deleteDone(ref childRef) {
	w.mu.Lock()
	delete(w.applied, ref)
	delete(w.replaced, ref)
	w.mu.Unlock()
}

// gone drops what is remembered of ref: the cache shows it deleted.
func (w *ownWrites) gone(ref childRef) {
	w.mu.Lock()
	delete(w.applied, ref)
	delete(w.replaced, ref)
	delete(w.deleted, ref)
	w.mu.Unlock()
}

// conflict notes whether the last apply of trigger key's child ref found a
// conflict.
func (w *ownWrites) conflict(key cache.ObjectName, ref childRef, conflict bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	refs := w.conflicted[key]
	switch {
	case conflict && refs == nil:
		w.conflicted[key] = map[childRef]bool{ref: true}
	case conflict:
		refs[ref] = true
	case refs != nil:
		delete(refs, ref)
		if len(refs) == 0 {
			delete(w.conflicted, key)
		}
	}
}

// hadConflict reports whether the last apply of trigger key's child ref
// found a conflict.
func (w *ownWrites) hadConflict(key cache.ObjectName, ref childRef) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conflicted[key][ref]
}

// forgetConflicts drops trigger key's conflicts: it wants no children
// (gone, or its when is false).
func (w *ownWrites) forgetConflicts(key cache.ObjectName) {
	w.mu.Lock()
	delete(w.conflicted, key)
	w.mu.Unlock()
}

// unheld notes that syncloop took the teardown finalizer off trigger key.
func (w *ownWrites) unheld(key cache.ObjectName) {
	w.mu.Lock()
	w.unheldKeys[key] = true
	w.mu.Unlock()
}

// wasUnheld reports, once, whether syncloop took the teardown finalizer
// off trigger key: it is gone from the cache now.
func (w *ownWrites) wasUnheld(key cache.ObjectName) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	was := w.unheldKeys[key]
	delete(w.unheldKeys, key)
	return was
}

// remembered is how many children's applies, deletes and in-flight
// applies, and how many triggers' conflicts, are remembered: for tests
// that check nothing outlives the objects.
func (w *ownWrites) remembered() (applied, deleted, inflight, conflicted int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.applied), len(w.deleted), len(w.inflight), len(w.conflicted)
}
