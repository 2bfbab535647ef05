package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// RolloutStore keeps rollouts and removals where a restarted syncloop
// finds them (the manager keeps them on the rule's revision objects) and
// says each transition where the user looks (an Event on the revision).
type RolloutStore interface {
	rollout.Store
	// Removed returns the rules set does not hold whose removal is to
	// do: the version of each that was in force last (its newest
	// revision), compiled, when it orders its teardown or deletes its
	// children on removal and its removal is not recorded yet.
	Removed(ctx context.Context, set *rules.Set) ([]*rules.Rule, error)
	// RecordRemoval keeps what removing r did, and says so.
	RecordRemoval(ctx context.Context, r *rules.Rule, rec RemovalRecord, eventType, reason, message string)
}

// rollingOut is a loop's rule during a rollout from its previous
// revision: the coordinator (engine/rollout), which says which revision
// each trigger is on, and the reconciler of the revision rolled out from.
// The loop's own reconciler is the new revision's.
type rollingOut struct {
	co   *rollout.Coordinator
	from *reconciler
	both []*reconciler // the loop's and from
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
func (e *Engine) rolloutFrom(old *ruleLoop, r *rules.Rule) *rollout.Plan {
	if r.Rollout.Strategy != rules.RolloutProgressive || (e.currentShard() != nil && e.rollouts == nil) {
		return nil
	}
	if st, _ := old.getState(); st != StateRunning || !sameTriggers(old.rule, r) || len(old.watches.trigger.Indexer().ListKeys()) == 0 {
		return nil
	}
	p := &rollout.Plan{From: old.rule, Rec: rollout.Record{Started: time.Now().Truncate(time.Second)}}
	if ro := old.ro.Load(); ro != nil {
		rec := ro.co.Record()
		switch rec.State {
		case rollout.Complete:
		case rollout.RolledBack:
			p.From = ro.from.rule
		default: // superseded mid-way: what it moved stays moved
			p.From = ro.from.rule
			p.Rec.Threshold, p.Rec.Started = rec.Threshold, rec.Started
		}
	}
	if p.From.Hash == r.Hash || !sameTriggers(p.From, r) {
		return nil
	}
	return p
}

// resumeRollout is the rollout of r that the store has recorded or that
// begins now (a rule changed while syncloop was down), or nil.
func (e *Engine) resumeRollout(ctx context.Context, r *rules.Rule) *rollout.Plan {
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
	p := &rollout.Plan{From: from, Rec: *rec}
	if rec.State == "" {
		p.Rec = rollout.Record{Threshold: rec.Threshold, Started: rec.Started}
		if p.Rec.Started.IsZero() {
			p.Rec.Started = time.Now().Truncate(time.Second)
		}
	}
	return p
}

// newRollingOut makes loop l's rollout as p says.
func newRollingOut(l *ruleLoop, p *rollout.Plan) *rollingOut {
	from := p.From
	w := &watches{rule: from, ns: l.watches.ns, actor: l.watches.actor, retired: retiredKinds(l.watches, from), filter: l.watches.filter}
	host := rolloutHost{l}
	ro := &rollingOut{co: rollout.New(l.rule, *p, l.e.currentShard() != nil, host, l.e.out.rollouts(l.rule, host.Coordinates)),
		from: l.reconcilerOf(from, w)}
	ro.both = []*reconciler{l.rc, ro.from}
	return ro
}

// rolloutCoordination is the key whose owner, in a sharded group, steps
// a rule's rollout.
var rolloutCoordination = cache.ObjectName{Name: "\x00rollout"}

// rolloutHost is a loop as its rollout's coordinator sees it.
type rolloutHost struct{ l *ruleLoop }

func (h rolloutHost) Triggers() cache.Store {
	if h.l.triggerSub.Load() == nil { // not subscribed yet
		return nil
	}
	return h.l.watches.trigger.Indexer()
}

func (h rolloutHost) Requeue(key cache.ObjectName) { h.l.add(key) }

// Coordinates: unsharded, every key is owned.
func (h rolloutHost) Coordinates() bool { return h.l.e.owns(h.l.rule.Name, rolloutCoordination) }

// Settled: a loop whose informers filter drops in place, now, what is
// not its share (share.go).
func (h rolloutHost) Settled() { h.l.poke() }

func (h rolloutHost) Contained(ctx context.Context, v any) error {
	return contained(klog.FromContext(ctx), h.l.e.metrics, h.l.rule.Name, PanicRollout, v)
}

// Children counts the rule's children in the caches — at home and in the
// clusters of the fleet — of triggers it watches.
func (h rolloutHost) Children() int {
	n := h.children(h.l.watches)
	if h.l.fleet != nil {
		for _, p := range h.l.fleet.each() {
			n += h.children(p.w)
		}
	}
	return n
}

// children counts the rule's children in w's caches whose trigger it
// watches.
func (h rolloutHost) children(w *watches) int {
	n := 0
	for _, ck := range w.children {
		if ck.sub == nil {
			continue
		}
		objs, _ := ck.sub.Indexer().ByIndex(ruleIndex, h.l.rule.Name)
		for _, o := range objs {
			if _, ok := h.l.ownTrigger(rules.Annotation(o.(object), rules.AnnotationOwner)); ok {
				n++
			}
		}
	}
	return n
}

// Prunes counts the children that moving keys to the new revision would
// remove: each trigger is rendered by it against the caches, as its
// reconcile will, and its children that are no longer wanted counted —
// at home and in the clusters of the fleet that answer.
func (h rolloutHost) Prunes(ctx context.Context, keys []cache.ObjectName) int {
	rc := h.l.rc
	n := 0
	for _, key := range keys {
		obj, ok, _ := rc.w.trigger.Indexer().GetByKey(key.String())
		if !ok {
			continue
		}
		owner := rc.triggerRef(key).Owner()
		existing := rc.childrenOf(owner)
		if len(existing) == 0 && !rc.remoteChildren(owner) {
			continue
		}
		rd, err := render.Rule(ctx, rc.renderInput(wholeOf(obj), &cacheLookuper{rc: rc, trigger: key}, nil))
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
		n += rc.remotePrunes(ctx, owner, rd, waiting)
	}
	return n
}

// Health judges trigger key under the new revision from the caches
// alone, as the replica that reconciles it would: the render succeeds,
// every child it wants is in the cache as this revision applies it, and
// every child is ready by its readyWhen.
func (h rolloutHost) Health(ctx context.Context, key cache.ObjectName) rollout.Health {
	rc := h.l.rc
	obj, ok, _ := rc.w.trigger.Indexer().GetByKey(key.String())
	if !ok {
		return rollout.Health{OK: true}
	}
	rd, err := render.Rule(ctx, rc.renderInput(wholeOf(obj), &cacheLookuper{rc: rc, trigger: key}, cachedChildren{rc}))
	return healthOf(rd, err)
}

// healthOf is a trigger's health under the new revision after a render
// (or a reconcile) that returned rd and err: failed, or not ready by its
// children's readyWhen; rd is nil when the trigger wanted no children.
func healthOf(rd *render.Rendered, err error) rollout.Health {
	switch {
	case err != nil:
		return rollout.Health{Why: err.Error()}
	case rd != nil && !rd.Skipped:
		// Children a rollout by cluster has not brought to their cluster
		// yet are no step's to judge.
		if c := rd.Readiness(); !c.Status && c.Reason != render.ReasonRolloutPending {
			return rollout.Health{Why: c.Message}
		}
	}
	return rollout.Health{OK: true}
}

// cachedChildren is a render.Applier that applies nothing: a child is its
// cached object when that is what the revision applies, else not there
// yet.
type cachedChildren struct{ rc *reconciler }

// Observed implements render.Applier: a health check reads no child
// whose apply failed; it fails the trigger's health.
func (cachedChildren) Observed(render.Child) map[string]any { return nil }

func (a cachedChildren) Apply(_ context.Context, c render.Child) (map[string]any, error) {
	if c.Patch {
		return c.Object.Object, nil
	}
	rc := a.rc
	if c.Cluster != "" { // in its cluster's caches
		if err := rc.held(c); err != nil {
			return nil, err
		}
		p, err := rc.placeOf(c.Cluster)
		if err != nil {
			return nil, err
		}
		rc = p.rc
	}
	ref := refOf(c.Object)
	ck := rc.w.children[ref.gvk]
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

// storedRollout records a rollout in the store, when this replica
// coordinates it.
type storedRollout struct {
	store       rollout.Store // nil: in memory only
	rule        *rules.Rule
	coordinates func() bool
}

func (s storedRollout) Record(ctx context.Context, rec rollout.Record, eventType, reason, msg string) {
	if s.store != nil && s.coordinates() {
		s.store.Record(ctx, s.rule, rec, eventType, reason, msg)
	}
}

func (s storedRollout) Fetch(ctx context.Context) (*rollout.Record, error) {
	if s.store == nil {
		return nil, nil
	}
	return s.store.Fetch(ctx, s.rule)
}

// plannedRollout tells a dry run's plan each transition of a rollout, and
// records nothing.
type plannedRollout struct {
	plan Planner
	rule string
}

func (p plannedRollout) Record(_ context.Context, _ rollout.Record, _, reason, msg string) {
	p.plan.Rollout(p.rule, reason, msg)
}

func (plannedRollout) Fetch(context.Context) (*rollout.Record, error) { return nil, nil }

// rolloutStarting reports whether the loop's rollout has yet to take its
// first step (or to decide it cannot).
func (l *ruleLoop) rolloutStarting() bool {
	ro := l.ro.Load()
	return ro != nil && ro.co.Starting()
}

// PlanRollouts are, after PlanOnce, the rollouts the plan went through:
// what Rollouts returned before the engine stopped.
func (e *Engine) PlanRollouts() []rollout.Status { return e.planned.rollouts }

// InForce returns the rules the engine runs: each loop's, and the
// revision a rollout moves from until the rollout completes — its
// triggers are reconciled by it meanwhile, and again after a rollback.
// (A removed rule's teardown calls none of its functions.)
func (e *Engine) InForce() []*rules.Rule {
	loops := e.allLoops() // a stopping loop's reconciles may still call its functions
	out := make([]*rules.Rule, 0, len(loops))
	for _, l := range loops {
		out = append(out, l.rule)
		if ro := l.ro.Load(); ro != nil && ro.co.Record().State != rollout.Complete {
			out = append(out, ro.from.rule)
		}
	}
	return out
}

// Rollouts returns the rollouts of the rules in force, by rule.
func (e *Engine) Rollouts() []rollout.Status {
	e.set.mu.Lock()
	var cos []*rollout.Coordinator
	for _, l := range e.set.loops {
		if ro := l.ro.Load(); ro != nil {
			cos = append(cos, ro.co)
		}
	}
	e.set.mu.Unlock()
	out := make([]rollout.Status, 0, len(cos))
	for _, co := range cos {
		out = append(out, co.Status())
	}
	slices.SortFunc(out, func(a, b rollout.Status) int { return strings.Compare(a.Rule, b.Rule) })
	return out
}
