package engine

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// The states of a rollout (RolloutRecord.State).
const (
	// RolloutProgressing: steps are under way.
	RolloutProgressing = "Progressing"
	// RolloutComplete: every trigger is on the new revision.
	RolloutComplete = "Complete"
	// RolloutHalted: a step failed, or the next would remove more
	// children than maxPrunes allows; nothing moves until the rule or its
	// rollout settings change.
	RolloutHalted = "Halted"
	// RolloutRolledBack: a step failed under onFailure: Rollback; every
	// trigger is on the revision rolled out from.
	RolloutRolledBack = "RolledBack"
	// RolloutSuperseded: the rule changed again before the rollout
	// ended; the rollout to the newer revision took its triggers over.
	RolloutSuperseded = "Superseded"
)

// Why a rollout halted or rolled back (RolloutRecord.Reason).
const (
	ReasonStepFailed  = "StepFailed"
	ReasonPruneBudget = "PruneBudget"
	// ReasonPanic: the coordinator panicked (PanicRollout); it decides
	// nothing more until the rule or its rollout settings change.
	ReasonPanic = "Panic"
)

// RolloutRecord is where one rollout of a rule stands: what its store
// keeps, so that a restart, or a new leader, continues it. Which revision
// a trigger is on follows from it alone: a trigger is on the new revision
// when the digest of its key salted with the rule's name (rolloutDigest)
// is below Threshold, or when it was created after Started — the same
// answer on every replica, at no cost per child.
type RolloutRecord struct {
	// From and To are the hashes of the revisions rolled out from and to.
	From  string `json:"from"`
	To    string `json:"to"`
	State string `json:"state"`
	// Step is the step under way (0: none yet); Steps how many there
	// are, as far as the triggers there now say.
	Step  int `json:"step"`
	Steps int `json:"steps"`
	// Threshold bounds the digests of the triggers moved so far;
	// StepFrom is where the step under way began.
	Threshold uint64 `json:"threshold,string"`
	StepFrom  uint64 `json:"stepFrom,string"`
	// Started is when the rollout began (to the second: as creation
	// times are); triggers created after it are on the new revision.
	Started     time.Time `json:"started"`
	StepStarted time.Time `json:"stepStarted"`
	// Moved of Total triggers (those there when it began) are on the new
	// revision.
	Moved int `json:"moved"`
	Total int `json:"total"`
	// Children is how many children the rule had when the rollout began;
	// Pruned how many its steps have removed (as rendered before each).
	Children int `json:"children"`
	Pruned   int `json:"pruned"`
	// Reason and Message say why it halted or rolled back.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// active reports whether the rollout still decides which revision
// triggers are on step by step.
func (r *RolloutRecord) active() bool {
	return r.State == RolloutProgressing || r.State == RolloutHalted
}

// Unfinished reports whether the record still splits the rule's triggers
// between its two revisions — under way, halted or rolled back — so that a
// restart resumes it and the revision it moves from must be kept.
func (r *RolloutRecord) Unfinished() bool { return r.active() || r.State == RolloutRolledBack }

// RolloutStore keeps rollouts where a restarted syncloop finds them (the
// manager keeps them on the rule's revision objects) and says each
// transition where the user looks (an Event on the revision).
type RolloutStore interface {
	// Resume returns the rollout of r recorded or to begin — a record
	// whose State is empty begins one, from its Threshold and Started if
	// set — and the revision it rolls out from, compiled; nil, nil when r
	// has none (its revision is the one recorded in force, or the first).
	Resume(ctx context.Context, r *rules.Rule) (*RolloutRecord, *rules.Rule, error)
	// Record keeps rec as r's rollout and, when reason is set, says so:
	// eventType is Normal or Warning.
	Record(ctx context.Context, r *rules.Rule, rec RolloutRecord, eventType, reason, message string)
	// Fetch reads the rollout recorded for r now (nil: none): how the
	// replicas of a sharded group follow the one that steps the rollout.
	Fetch(ctx context.Context, r *rules.Rule) (*RolloutRecord, error)
	// Removed returns the rules set does not hold whose removal is to
	// do: the version of each that was in force last (its newest
	// revision), compiled, when it orders its teardown or deletes its
	// children on removal and its removal is not recorded yet.
	Removed(ctx context.Context, set *rules.Set) ([]*rules.Rule, error)
	// RecordRemoval keeps what removing r did, and says so.
	RecordRemoval(ctx context.Context, r *rules.Rule, rec RemovalRecord, eventType, reason, message string)
}

// RolloutStatus is one rule's rollout as the engine runs it, for
// metrics and /readyz.
type RolloutStatus struct {
	Rule string
	RolloutRecord
	// OnFrom and OnTo count the triggers in the cache on each revision.
	OnFrom, OnTo int
}

// rollout is a loop's rollout of a changed rule: the loop's own
// reconciler is the new revision's, from the previous one's. It moves the
// triggers there when it began in steps, in the order of their salted
// digests, each step once the one before is healthy, and keeps the
// record.
type rollout struct {
	l    *ruleLoop
	from *reconciler
	both []*reconciler // the loop's and from
	// settled: complete, every trigger is on the new revision for good.
	settled atomic.Bool
	// sharded: replicas share the triggers. The replica whose shard owns
	// the rule's coordination key steps the rollout, judging the health
	// of every trigger of a step from its caches; the others follow the
	// record it keeps.
	sharded  bool
	settings atomic.Pointer[rules.Rollout]
	store    RolloutStore
	poke     chan struct{}

	mu  sync.Mutex
	rec RolloutRecord
	// step are the triggers of the step under way; health what the last
	// reconcile under the new revision made of each trigger on it.
	step   map[cache.ObjectName]bool
	health map[cache.ObjectName]health
}

// health is one trigger's last reconcile under the new revision: ok when
// it succeeded and every child is ready; why, when not.
type health struct {
	ok  bool
	why string
}

// rolloutPlan is what a loop is made with to run a rollout: the revision
// from and the record to begin or continue.
type rolloutPlan struct {
	from *rules.Rule
	rec  RolloutRecord
}

// rolloutDigest orders a rule's triggers for its rollouts: the same order
// for every rollout of the rule (a rollout superseded mid-way continues
// with the triggers it had moved), another for another rule.
func rolloutDigest(rule string, key cache.ObjectName) uint64 {
	sum := sha256.Sum256([]byte(rule + "\x00" + key.String()))
	return binary.BigEndian.Uint64(sum[:8])
}

// sameTriggers reports whether two versions of a rule watch the same
// objects: a rollout moves triggers between revisions only then.
func sameTriggers(a, b *rules.Rule) bool {
	return a.Identity == b.Identity && a.Watch.GVK == b.Watch.GVK && a.Watch.Namespace == b.Watch.Namespace &&
		a.Watch.LabelSelector.String() == b.Watch.LabelSelector.String() &&
		a.Watch.FieldSelector.String() == b.Watch.FieldSelector.String()
}

// rolloutFrom decides how the running loop old gives way to r: a rollout
// from the revision its triggers are on, or nil (at once): r's strategy
// is Immediate, the engine is sharded with no store to share the record
// through, old never ran or has no triggers, r watches other objects, or
// r is the revision rolled out from (a change put back).
func (e *Engine) rolloutFrom(old *ruleLoop, r *rules.Rule) *rolloutPlan {
	if r.Rollout.Strategy != rules.RolloutProgressive || (e.currentShard() != nil && e.rollouts == nil) {
		return nil
	}
	if st, _ := old.getState(); st != StateRunning || !sameTriggers(old.rule, r) || len(old.watches.trigger.Indexer().ListKeys()) == 0 {
		return nil
	}
	p := &rolloutPlan{from: old.rule, rec: RolloutRecord{Started: time.Now().Truncate(time.Second)}}
	if ro := old.ro.Load(); ro != nil {
		rec := ro.record()
		switch rec.State {
		case RolloutComplete:
		case RolloutRolledBack:
			p.from = ro.from.rule
		default: // superseded mid-way: what it moved stays moved
			p.from = ro.from.rule
			p.rec.Threshold, p.rec.Started = rec.Threshold, rec.Started
		}
	}
	if p.from.Hash == r.Hash || !sameTriggers(p.from, r) {
		return nil
	}
	return p
}

// resumeRollout is the rollout of r that the store has recorded or that
// begins now (a rule changed while syncloop was down), or nil.
func (e *Engine) resumeRollout(ctx context.Context, r *rules.Rule) *rolloutPlan {
	if e.rollouts == nil || r.Rollout.Strategy != rules.RolloutProgressive {
		return nil
	}
	rec, from, err := e.rollouts.Resume(ctx, r)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Cannot resume the rule's rollout: its triggers move at once", "rule", r.Name)
		return nil
	case rec == nil || from == nil || !sameTriggers(from, r):
		return nil
	}
	p := &rolloutPlan{from: from, rec: *rec}
	if rec.State == "" {
		p.rec = RolloutRecord{Threshold: rec.Threshold, Started: rec.Started}
		if p.rec.Started.IsZero() {
			p.rec.Started = time.Now().Truncate(time.Second)
		}
	}
	return p
}

// settle marks the rollout complete for good: every trigger is on the new
// revision. A loop whose informers filter drops in place, now, what is
// not its share (share.go).
func (ro *rollout) settle() {
	if !ro.settled.Swap(true) {
		ro.l.poke()
	}
}

// newRollout makes loop l's rollout as p says.
func newRollout(l *ruleLoop, p *rolloutPlan) *rollout {
	e := l.e
	from := p.from
	w := &watches{rule: from, ns: l.watches.ns, actor: l.watches.actor, retired: retiredKinds(l.watches, from), filter: l.watches.filter}
	ro := &rollout{l: l, store: e.rollouts, poke: make(chan struct{}, 1), rec: p.rec, sharded: e.currentShard() != nil,
		step: map[cache.ObjectName]bool{}, health: map[cache.ObjectName]health{}}
	ro.rec.From, ro.rec.To = from.Hash, l.rule.Hash
	s := l.rule.Rollout
	ro.settings.Store(&s)
	ro.from = l.reconcilerOf(from, w)
	ro.both = []*reconciler{l.rc, ro.from}
	ro.settled.Store(ro.rec.State == RolloutComplete)
	return ro
}

func (ro *rollout) record() RolloutRecord {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	return ro.rec
}

// onNew reports whether trigger key is on the new revision.
func (ro *rollout) onNew(key cache.ObjectName) bool {
	t := trigger{key: key, digest: rolloutDigest(ro.l.rule.Name, key)}
	if obj, ok, _ := ro.l.watches.trigger.Indexer().GetByKey(key.String()); ok {
		t.created = obj.(object).GetCreationTimestamp().Time
	}
	rec := ro.record()
	return rec.puts(t)
}

// trigger is a cached trigger as a rollout sees it: its key, its rollout
// digest and when it was created (zero: not cached).
type trigger struct {
	key     cache.ObjectName
	digest  uint64
	created time.Time
}

// eachTrigger calls fn with every cached trigger.
func (ro *rollout) eachTrigger(fn func(trigger)) {
	for _, obj := range ro.l.watches.trigger.Indexer().List() {
		u := obj.(object)
		key := cache.ObjectName{Namespace: u.GetNamespace(), Name: u.GetName()}
		fn(trigger{key: key, digest: rolloutDigest(ro.l.rule.Name, key), created: u.GetCreationTimestamp().Time})
	}
}

// existing reports whether t was there when the rollout began (started):
// the triggers its steps move. Those created since are on the new
// revision from the start.
func (t trigger) existing(started time.Time) bool { return !t.created.After(started) }

// puts reports whether the record puts t on the new revision.
func (r *RolloutRecord) puts(t trigger) bool {
	switch r.State {
	case RolloutComplete:
		return true
	case RolloutRolledBack:
		return false
	}
	return t.digest < r.Threshold || !t.existing(r.Started)
}

// observe notes what a reconcile under the new revision made of trigger
// key, and wakes the rollout when it is one it waits for.
func (ro *rollout) observe(key cache.ObjectName, rd *render.Rendered, err error) {
	h := health{ok: true}
	switch {
	case err != nil:
		h = health{why: err.Error()}
	case rd != nil && !rd.Skipped:
		if c := rd.Readiness(); !c.Status {
			h = health{why: c.Message}
		}
	}
	ro.mu.Lock()
	if !ro.rec.active() && ro.rec.State != "" {
		ro.mu.Unlock()
		return
	}
	ro.health[key] = h
	waited := ro.step[key]
	ro.mu.Unlock()
	if waited {
		ro.wake()
	}
}

func (ro *rollout) wake() {
	select {
	case ro.poke <- struct{}{}:
	default:
	}
}

// setSettings takes the rule's rollout settings as they now are; a
// halted rollout goes on under them (raising maxPrunes confirms a
// removal).
func (ro *rollout) setSettings(ctx context.Context, s rules.Rollout) {
	if old := ro.settings.Load(); old != nil && *old == s {
		return
	}
	ro.settings.Store(&s)
	if !ro.coordinates() {
		return // the coordinating replica resumes it, and this one follows
	}
	ro.mu.Lock()
	halted := ro.rec.State == RolloutHalted
	if halted { // the step under way is checked again, under them
		ro.rec.State, ro.rec.Reason, ro.rec.Message = RolloutProgressing, "", ""
		ro.rec.StepStarted = time.Now()
	}
	rec := ro.rec
	ro.mu.Unlock()
	if halted {
		ro.save(ctx, rec, "Normal", "RolloutResumed", fmt.Sprintf("the rollout settings changed (%s): going on from step %d", s, rec.Step))
		ro.wake()
	}
}

// run drives the rollout once the loop's informers have synced, until
// ctx ends: it checks the step under way when a trigger it waits for was
// reconciled, and every second for the deadline.
func (ro *rollout) run(ctx context.Context) {
	if ro.sharded {
		ro.runSharded(ctx)
		return
	}
	ro.guard(ctx, ro.begin)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ro.poke:
		case <-tick.C:
		}
		ro.guard(ctx, ro.check)
	}
}

// guard runs fn, a step of the coordinator, and contains a panic in it
// (PanicRollout): the rollout halts where it is — the triggers moved stay
// on the new revision, the others on the old — and says why.
func (ro *rollout) guard(ctx context.Context, fn func(context.Context)) {
	defer func() {
		if v := recover(); v != nil {
			pe := contained(klog.FromContext(ctx), ro.l.e.metrics, ro.l.rule.Name, PanicRollout, v)
			ro.l.step(ctx, func(ctx context.Context) { ro.halt(ctx, ReasonPanic, pe.Error()) })
		}
	}()
	fn(ctx)
}

// begin starts the rollout, or picks it up where its record says.
func (ro *rollout) begin(ctx context.Context) {
	func() {
		ro.mu.Lock()
		defer ro.mu.Unlock()
		if ro.rec.State == "" {
			ro.rec.State = RolloutProgressing
			ro.rec.Total, ro.rec.Moved = ro.counts()
			ro.rec.Children = ro.children()
		} else {
			ro.step = ro.stepKeys(ro.rec.StepFrom, ro.rec.Threshold)
		}
	}()
	if ro.record().State == RolloutProgressing && ro.record().Step == 0 {
		ro.next(ctx)
	}
}

// rolloutCoordination is the key whose owner, in a sharded group, steps
// a rule's rollout.
var rolloutCoordination = cache.ObjectName{Name: "\x00rollout"}

// runSharded drives the rollout of a sharded group: every second the
// replica that owns the coordination key checks the step under way (and
// begins the rollout, unless another replica has already: it reads the
// record first); every other replica reads the record and follows it,
// queueing its own triggers that changed revision. It stops following
// once the rollout is complete or rolled back.
func (ro *rollout) runSharded(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	began, ticks := false, 0
	for {
		state := ro.record().State
		switch {
		case ro.coordinates():
			if !began {
				ro.guard(ctx, ro.follow)
				ro.guard(ctx, ro.begin)
				began = true
			}
			ro.guard(ctx, ro.check)
		case ro.settled.Load() || state == RolloutRolledBack:
		case state == RolloutHalted && ticks%10 != 0: // halted for long, perhaps: read it less often
		default:
			began = false
			ro.guard(ctx, ro.follow)
		}
		// Once a second, not on every reconcile (ro.poke): the coordinator
		// renders the whole step to judge it, a follower reads the record.
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			ticks++
		}
	}
}

// coordinates reports whether this replica steps the rollout: not sharded,
// or its shard owns the coordination key.
func (ro *rollout) coordinates() bool {
	return !ro.sharded || ro.l.e.owns(ro.l.rule.Name, rolloutCoordination)
}

// follow takes the record the coordinating replica keeps, when it is of
// this rollout, and queues this replica's triggers that it moves.
func (ro *rollout) follow(ctx context.Context) {
	if ro.store == nil {
		return
	}
	rec, err := ro.store.Fetch(ctx, ro.l.rule)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Reading the rule's rollout", "rule", ro.l.rule.Name, "err", err)
		return
	}
	ro.mu.Lock()
	if rec == nil || rec.To != ro.rec.To || rec.From != ro.rec.From || rec.State == "" || rec.State == RolloutSuperseded {
		ro.mu.Unlock()
		return
	}
	old := ro.rec
	ro.rec = *rec
	ro.step = ro.stepKeys(rec.StepFrom, rec.Threshold)
	ro.mu.Unlock()
	if rec.State == RolloutComplete {
		ro.settle()
	}
	if old.State == rec.State && old.Threshold == rec.Threshold && old.Started.Equal(rec.Started) {
		return
	}
	ro.eachTrigger(func(t trigger) {
		if old.puts(t) != rec.puts(t) {
			ro.l.add(t.key)
		}
	})
}

// counts are the triggers there when the rollout began, and how many of
// them it has moved. Called with ro.mu held.
func (ro *rollout) counts() (total, moved int) {
	ro.eachTrigger(func(t trigger) {
		if t.existing(ro.rec.Started) {
			total++
			if t.digest < ro.rec.Threshold {
				moved++
			}
		}
	})
	return total, moved
}

// children counts the rule's children in the caches: those of triggers
// it watches.
func (ro *rollout) children() int {
	n := 0
	for _, ck := range ro.l.watches.children {
		if ck.sub == nil {
			continue
		}
		objs, _ := ck.sub.Indexer().ByIndex(ruleIndex, ro.l.rule.Name)
		for _, o := range objs {
			if _, ok := ro.l.ownTrigger(rules.Annotation(o.(object), rules.AnnotationOwner)); ok {
				n++
			}
		}
	}
	return n
}

// stepKeys are the cached triggers whose digests are in [lo, hi). Called
// with ro.mu held.
func (ro *rollout) stepKeys(lo, hi uint64) map[cache.ObjectName]bool {
	out := map[cache.ObjectName]bool{}
	ro.eachTrigger(func(t trigger) {
		if t.digest >= lo && t.digest < hi {
			out[t.key] = true
		}
	})
	return out
}

// waiting are the triggers still on the previous revision that were there
// when the rollout began, in rollout order.
func (ro *rollout) waiting(rec RolloutRecord) []trigger {
	var out []trigger
	ro.eachTrigger(func(t trigger) {
		if t.existing(rec.Started) && t.digest >= rec.Threshold {
			out = append(out, t)
		}
	})
	slices.SortFunc(out, func(a, b trigger) int { return cmp.Compare(a.digest, b.digest) })
	return out
}

// next begins the next step: the next triggers in rollout order move to
// the new revision — unless what the change would remove so far passes
// maxPrunes, when the rollout halts and says how much it would remove in
// all — or, when none is left, the rollout is complete.
func (ro *rollout) next(ctx context.Context) {
	s := *ro.settings.Load()
	rec := ro.record()
	left := ro.waiting(rec)
	if len(left) == 0 {
		ro.complete(ctx)
		return
	}
	size := max(1, s.Step.Of(rec.Total))
	batch := left[:min(size, len(left))]
	prunes := ro.prunes(ctx, batch)
	if budget := s.MaxPrunes.Of(rec.Children); prunes > 0 && rec.Pruned+prunes > budget {
		all := rec.Pruned + ro.prunes(ctx, left)
		ro.halt(ctx, ReasonPruneBudget, fmt.Sprintf(
			"the change removes %d of the rule's %d children in all (%d so far), more than maxPrunes %s allows (%d): to confirm, raise spec.rollout.maxPrunes (100%% allows any removal)",
			all, rec.Children, rec.Pruned, s.MaxPrunes, budget))
		return
	}
	threshold := uint64(math.MaxUint64)
	if len(batch) < len(left) {
		threshold = left[len(batch)].digest
	}
	ro.mu.Lock()
	ro.rec.StepFrom, ro.rec.Threshold = ro.rec.Threshold, threshold
	ro.rec.Step++
	ro.rec.Steps = ro.rec.Step + (len(left)-len(batch)+size-1)/size
	ro.rec.Moved += len(batch)
	ro.rec.Pruned += prunes
	ro.rec.StepStarted = time.Now()
	ro.step = map[cache.ObjectName]bool{}
	for _, t := range batch {
		ro.step[t.key] = true
		delete(ro.health, t.key)
	}
	rec = ro.rec
	ro.mu.Unlock()
	msg := fmt.Sprintf("step %d of %d: %d triggers move to revision %s (%d of %d moved)", rec.Step, rec.Steps, len(batch), short(rec.To), rec.Moved, rec.Total)
	if prunes > 0 {
		msg += fmt.Sprintf("; it removes %d children (%d in all so far)", prunes, rec.Pruned)
	}
	klog.FromContext(ctx).Info("Rollout step", "rule", ro.l.rule.Name, "step", rec.Step, "steps", rec.Steps, "triggers", len(batch), "moved", rec.Moved, "total", rec.Total)
	ro.save(ctx, rec, "Normal", "RolloutStep", msg)
	for _, t := range batch {
		ro.l.add(t.key)
	}
}

// check moves on when the step under way is healthy, or fails it when its
// deadline has passed with more failed triggers than maxFailures allows.
func (ro *rollout) check(ctx context.Context) {
	s := *ro.settings.Load()
	unhealthy, overdue, failed, ok := ro.stepHealth(ctx, s)
	if !ok {
		return
	}
	switch {
	case unhealthy == 0:
	case !overdue:
		return
	case unhealthy > s.MaxFailures:
		ro.fail(ctx, s, failed)
		return
	}
	ro.next(ctx)
}

// stepHealth is the health of the step under way: how many of its
// triggers are not healthy, whether its deadline has passed, and when
// both fail it, why each failed; ok is false when no step is under way.
func (ro *rollout) stepHealth(ctx context.Context, s rules.Rollout) (unhealthy int, overdue bool, failed []string, ok bool) {
	ro.mu.Lock()
	defer ro.mu.Unlock()
	if ro.rec.State != RolloutProgressing || ro.rec.Step == 0 {
		return 0, false, nil, false
	}
	if ro.sharded {
		// Other replicas reconcile most of the step: its health is read
		// from the caches, which hold every trigger's children.
		for key := range ro.step {
			ro.health[key] = ro.healthFromCaches(ctx, key)
		}
	}
	triggers := ro.l.watches.trigger.Indexer()
	for key := range ro.step {
		if h := ro.health[key]; !h.ok {
			if _, exists, _ := triggers.GetByKey(key.String()); !exists {
				delete(ro.step, key) // deleted: simply gone
				continue
			}
			unhealthy++
		}
	}
	overdue = time.Since(ro.rec.StepStarted) > s.ProgressDeadline
	if unhealthy > s.MaxFailures && overdue {
		for key := range ro.step {
			if h, seen := ro.health[key]; !seen {
				failed = append(failed, key.String()+": not reconciled under the new revision yet")
			} else if !h.ok {
				failed = append(failed, key.String()+": "+h.why)
			}
		}
	}
	return unhealthy, overdue, failed, true
}

// fail ends a step that failed: the rollout halts, or rolls back.
func (ro *rollout) fail(ctx context.Context, s rules.Rollout, failed []string) {
	slices.Sort(failed)
	msg := fmt.Sprintf("step %d: %d triggers not healthy within %v (maxFailures %d): %s", ro.record().Step, len(failed), s.ProgressDeadline, s.MaxFailures, summarize(failed, 5))
	if s.OnFailure == rules.RolloutRollback {
		ro.rollBack(ctx, msg)
		return
	}
	ro.halt(ctx, ReasonStepFailed, msg)
}

func (ro *rollout) halt(ctx context.Context, reason, msg string) {
	ro.mu.Lock()
	ro.rec.State, ro.rec.Reason, ro.rec.Message = RolloutHalted, reason, msg
	rec := ro.rec
	ro.mu.Unlock()
	klog.FromContext(ctx).Info("Rollout halted", "rule", ro.l.rule.Name, "reason", reason, "message", msg)
	ro.save(ctx, rec, "Warning", "RolloutHalted", msg)
}

// rollBack moves every trigger on the new revision back: each is
// reconciled by the previous revision again.
func (ro *rollout) rollBack(ctx context.Context, msg string) {
	var back []cache.ObjectName
	rec := func() RolloutRecord {
		ro.mu.Lock()
		defer ro.mu.Unlock()
		ro.eachTrigger(func(t trigger) {
			if ro.rec.puts(t) {
				back = append(back, t.key)
			}
		})
		ro.rec.State, ro.rec.Reason, ro.rec.Message = RolloutRolledBack, ReasonStepFailed, msg
		return ro.rec
	}()
	klog.FromContext(ctx).Info("Rollout rolled back", "rule", ro.l.rule.Name, "triggers", len(back), "message", msg)
	ro.save(ctx, rec, "Warning", "RolloutRolledBack", fmt.Sprintf("%s; %d triggers go back to revision %s", msg, len(back), short(rec.From)))
	for _, k := range back {
		ro.l.add(k)
	}
}

func (ro *rollout) complete(ctx context.Context) {
	ro.mu.Lock()
	ro.settle()
	ro.rec.State, ro.rec.Reason, ro.rec.Message = RolloutComplete, "", ""
	ro.rec.Threshold = math.MaxUint64
	ro.rec.Moved = ro.rec.Total
	ro.step = map[cache.ObjectName]bool{}
	rec := ro.rec
	ro.mu.Unlock()
	klog.FromContext(ctx).Info("Rollout complete", "rule", ro.l.rule.Name, "steps", rec.Step, "triggers", rec.Total)
	ro.save(ctx, rec, "Normal", "RolloutComplete", fmt.Sprintf("every trigger is on revision %s, after %d steps", short(rec.To), rec.Step))
}

// supersede records that the rule changed again before the rollout ended.
func (ro *rollout) supersede(ctx context.Context, by *rules.Rule) {
	if !ro.coordinates() {
		return
	}
	ro.mu.Lock()
	if !ro.rec.active() {
		ro.mu.Unlock()
		return
	}
	ro.rec.State, ro.rec.Reason, ro.rec.Message = RolloutSuperseded, "", "the rule changed again: revision "+short(by.Hash)+" took its triggers over"
	rec := ro.rec
	ro.mu.Unlock()
	ro.save(ctx, rec, "Normal", "RolloutSuperseded", rec.Message)
}

func (ro *rollout) save(ctx context.Context, rec RolloutRecord, eventType, reason, msg string) {
	if rp, ok := ro.l.e.plan.(rolloutPlanner); ok {
		rp.Rollout(ro.l.rule.Name, reason, msg) // a dry run records nothing
		return
	}
	if ro.store != nil && ro.l.e.plan == nil && ro.coordinates() {
		ro.store.Record(ctx, ro.l.rule, rec, eventType, reason, msg)
	}
}

// prunes counts the children that moving triggers to the new revision would
// remove: each trigger is rendered by it against the caches, as its
// reconcile will, and its children that are no longer wanted counted.
func (ro *rollout) prunes(ctx context.Context, triggers []trigger) int {
	rc := ro.l.rc
	watch := rc.rule.Watch
	n := 0
	for _, t := range triggers {
		key := t.key
		obj, ok, _ := rc.w.trigger.Indexer().GetByKey(key.String())
		if !ok {
			continue
		}
		trigger := wholeOf(obj)
		owner := rules.Trigger{APIVersion: watch.APIVersion, Kind: watch.Kind, Namespace: key.Namespace, Name: key.Name}.String()
		existing := rc.childrenOf(owner)
		if len(existing) == 0 {
			continue
		}
		rd, err := render.Rule(ctx, rc.rule, trigger, rc.mapper, &cacheLookuper{rc: rc, trigger: key}, nil)
		if err != nil {
			continue // a render that fails prunes nothing
		}
		var desired map[childRef]bool
		waiting := map[string]bool{}
		if !rd.Skipped {
			desired = map[childRef]bool{}
			for _, c := range rd.Children {
				desired[refOf(c.Object)] = true
			}
			for _, ce := range rd.Conflicts {
				desired[conflictRef(ce)] = true
			}
			for _, st := range rd.Waiting() {
				waiting[st.Resource.ID] = true
			}
		}
		n += len(rc.prunable(ctx, owner, existing, desired, waiting, false))
	}
	return n
}

// healthFromCaches judges trigger key under the new revision from the
// caches alone, as the replica that reconciles it would: the render
// succeeds, every child it wants is in the cache as this revision applies
// it, and every child is ready by its readyWhen.
func (ro *rollout) healthFromCaches(ctx context.Context, key cache.ObjectName) health {
	rc := ro.l.rc
	obj, ok, _ := rc.w.trigger.Indexer().GetByKey(key.String())
	if !ok {
		return health{ok: true}
	}
	rd, err := render.Rule(ctx, rc.rule, wholeOf(obj), rc.mapper, &cacheLookuper{rc: rc, trigger: key}, cachedChildren{rc})
	switch {
	case err != nil:
		return health{why: err.Error()}
	case rd.Skipped:
		return health{ok: true}
	}
	if c := rd.Readiness(); !c.Status {
		return health{why: c.Message}
	}
	return health{ok: true}
}

// cachedChildren is a render.Applier that applies nothing: a child is its
// cached object when that is what the revision applies, else not there
// yet.
type cachedChildren struct{ rc *reconciler }

func (a cachedChildren) Apply(_ context.Context, c render.Child) (map[string]any, error) {
	if c.Patch {
		return c.Object.Object, nil
	}
	ref := refOf(c.Object)
	ck := a.rc.w.children[ref.gvk]
	if ck == nil || ck.sub == nil {
		return nil, fmt.Errorf("%s %s is not watched", ref.gvk.Kind, cacheKey(ref))
	}
	obj, ok, _ := ck.sub.Indexer().GetByKey(cacheKey(ref))
	if !ok {
		return nil, fmt.Errorf("%s %s is not there yet", ref.gvk.Kind, cacheKey(ref))
	}
	cached := obj.(object)
	if rules.Annotation(cached, rules.AnnotationAppliedHash) != contentHash(c.Object.Object) {
		return nil, fmt.Errorf("%s %s is not applied by this revision yet", ref.gvk.Kind, cacheKey(ref))
	}
	return wholeOf(cached).Object, nil
}

// status is the rollout as it stands, with the cached triggers counted
// on each revision.
func (ro *rollout) status() RolloutStatus {
	st := RolloutStatus{Rule: ro.l.rule.Name, RolloutRecord: ro.record()}
	sub := ro.l.triggerSub.Load() // nil until the loop has subscribed
	if sub == nil {
		return st
	}
	ro.eachTrigger(func(t trigger) {
		if st.puts(t) {
			st.OnTo++
		} else {
			st.OnFrom++
		}
	})
	return st
}

// rolloutStarting reports whether the loop's rollout has yet to take its
// first step (or to decide it cannot).
func (l *ruleLoop) rolloutStarting() bool {
	ro := l.ro.Load()
	if ro == nil {
		return false
	}
	rec := ro.record()
	return rec.State == "" || rec.State == RolloutProgressing && rec.Step == 0
}

// PlanRollouts are, after PlanOnce, the rollouts the plan went through:
// what Rollouts returned before the engine stopped.
func (e *Engine) PlanRollouts() []RolloutStatus { return e.planned }

// Rollouts returns the rollouts of the rules in force, by rule.
func (e *Engine) Rollouts() []RolloutStatus {
	e.mu.Lock()
	var ros []*rollout
	for _, l := range e.loops {
		if ro := l.ro.Load(); ro != nil {
			ros = append(ros, ro)
		}
	}
	e.mu.Unlock()
	out := make([]RolloutStatus, 0, len(ros))
	for _, ro := range ros {
		out = append(out, ro.status())
	}
	slices.SortFunc(out, func(a, b RolloutStatus) int { return strings.Compare(a.Rule, b.Rule) })
	return out
}

// short is a revision hash as revisions are named: its first 10 digits.
func short(hash string) string { return hash[:min(10, len(hash))] }

// summarize lists the first n of items, and how many more there are.
func summarize(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:n], "; "), len(items)-n)
}
