package engine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// Leaving a cluster. The children of a resource with clusters.onLeave:
// Delete, in a cluster their trigger selects no more, are deleted there —
// unless the children leaving that cluster, all the rule's triggers
// together, are more than rollout.maxPrunes of the rule's children there.
// Then none is deleted until maxPrunes is raised: a relabelled or
// mislabelled cluster that every trigger leaves at once loses nothing,
// while one trigger that moves takes its children along.
//
// A reconcile only tells the trigger's place what it selected; the
// deletes are the sweep's, which runs when the rule is idle — every
// trigger that an event (a relabel, a lookup's change) queued has told
// its new selection by then — and decides over the whole picture. A place
// made anew (a restart, a new kubeconfig) knows no selection and deletes
// nothing there until every trigger with children there has told its
// own: a restart decides as the loop before it would have.

// ReasonLeaveHeld is the reason of the Warning Event on a trigger whose
// children leaving a cluster are held there.
const ReasonLeaveHeld = "LeaveHeld"

// leaves is what a place knows of the triggers' selections: for each
// trigger (by owner annotation) reconciled since the place was made, the
// ids of its onLeave: Delete resources that left the cluster; the
// triggers whose leaving children are held, told once; and how many
// leaving children the sweeps deleted since none was left.
type leaves struct {
	mu      sync.Mutex
	left    map[string]map[string]bool
	leaving int // owners whose left is not empty
	held    map[string]bool
	deleted int
}

func newLeaves() *leaves {
	return &leaves{left: map[string]map[string]bool{}, held: map[string]bool{}}
}

// tell records owner's selection: the ids of the resources that left the
// cluster. The ids in unknown are of resources that wait (not rendered):
// what was known of them stays. It reports whether children may be
// leaving the cluster now: a sweep is wanted.
func (lv *leaves) tell(owner string, leaving, unknown map[string]bool) bool {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	var now map[string]bool // nil: nothing leaves, the common case, told without a map
	for id := range leaving {
		now = setOf(now, id)
	}
	for id := range lv.left[owner] {
		if unknown[id] {
			now = setOf(now, id)
		}
	}
	lv.set(owner, now, true)
	return lv.leaving > 0 || len(lv.held) > 0
}

// set makes owner's selection now (told: known at all). Called with mu
// held.
func (lv *leaves) set(owner string, now map[string]bool, told bool) {
	if len(lv.left[owner]) > 0 {
		lv.leaving--
	}
	if !told {
		delete(lv.left, owner)
		delete(lv.held, owner)
		return
	}
	lv.left[owner] = now
	if len(now) > 0 {
		lv.leaving++
	}
}

// setOf is set with id in it, made when nil.
func setOf[K comparable](set map[K]bool, k K) map[K]bool {
	if set == nil {
		set = map[K]bool{}
	}
	set[k] = true
	return set
}

// forget drops owner: it wants no children any more (gone, or its when
// is false), and its children go whatever the selection.
func (lv *leaves) forget(owner string) {
	lv.mu.Lock()
	lv.set(owner, nil, false)
	lv.mu.Unlock()
}

// leaveDecision decides whether the children leaving a cluster may go.
// children are all the rule's children there, left what the triggers told
// (leaves.left), exists whether an owner that told nothing still has a
// trigger (its selection is to come), deleted how many leaving children
// went since none was left. going are the children leaving; held says
// that the budget holds them, why how (or what is awaited when not held).
func leaveDecision(children []object, left map[string]map[string]bool, exists func(owner string) bool, budget rules.Amount, deleted int) (going []object, ok, held bool, why string) {
	unknown := map[string]bool{}
	for _, c := range children {
		owner := rules.Annotation(c, rules.AnnotationOwner)
		ids, told := left[owner]
		switch {
		case told:
			if ids[rules.Annotation(c, rules.AnnotationResourceID)] {
				going = append(going, c)
			}
		case exists(owner):
			unknown[owner] = true
		}
	}
	switch n := budget.Of(len(children) + deleted); {
	case len(going) == 0:
		return nil, true, false, ""
	case len(unknown) > 0:
		return going, false, false, fmt.Sprintf("%d more triggers with children there are to be reconciled first (%s): the children leaving are counted all together", len(unknown), firstOf(unknown))
	case len(going)+deleted > n:
		return going, false, true, fmt.Sprintf("%d of the rule's %d children there are leaving (%d gone already), more than rollout.maxPrunes (%s, %d) allows: none is deleted. Raise spec.rollout.maxPrunes to confirm (100%% allows any), or put the cluster back in the selection",
			len(going)+deleted, len(children)+deleted, deleted, budget, n)
	}
	return going, true, false, ""
}

// firstOf is the first key of set, in order, for messages.
func firstOf(set map[string]bool) string { return slices.Min(slices.Collect(maps.Keys(set))) }

// leaveSweeps is the fleet's side of leaving: whether a sweep is wanted,
// and the rule's rollout.maxPrunes, which a change of the rule may raise
// without a new revision.
type leaveSweeps struct {
	wanted, running atomic.Bool
	budget          atomic.Pointer[rules.Amount]
}

// sweepEvery is how often a loop whose children may be leaving a cluster
// looks whether it is idle, to sweep.
const sweepEvery = time.Second

// wantSweep has the sweep run once the rule is idle.
func (lf *loopFleet) wantSweep() { lf.leave.wanted.Store(true) }

// sweepPending reports whether a sweep is to run: the rule is not done.
func (lf *loopFleet) sweepPending() bool { return lf.leave.wanted.Load() || lf.leave.running.Load() }

// setBudget takes the rule's maxPrunes as it is now; raised (or lowered),
// the held children are decided again.
func (lf *loopFleet) setBudget(a rules.Amount) {
	if old := lf.leave.budget.Swap(&a); *old != a {
		lf.wantSweep()
	}
}

// sweep deletes, in every place that can be reached, the children leaving
// it if leaveDecision lets them go, and says on their triggers which are
// held; it runs once the rule is idle.
func (lf *loopFleet) sweep(ctx context.Context) {
	if !lf.leave.wanted.Load() || !lf.l.idle() {
		return
	}
	lf.leave.running.Store(true)
	defer lf.leave.running.Store(false)
	lf.leave.wanted.Store(false)
	lf.l.step(ctx, func(ctx context.Context) {
		for _, p := range lf.each() {
			if p.unreachable() == nil {
				lf.sweepPlace(ctx, p)
			}
		}
	})
}

// sweepPlace is sweep in one place.
func (lf *loopFleet) sweepPlace(ctx context.Context, p *place) {
	children := p.rc.ruleChildren()
	exists := func(owner string) bool {
		key, ok := lf.l.ownTrigger(owner)
		if !ok {
			return false
		}
		_, found, _ := lf.l.watches.trigger.Indexer().GetByKey(key.String())
		return found
	}
	p.leave.mu.Lock()
	going, ok, held, why := leaveDecision(children, p.leave.left, exists, *lf.leave.budget.Load(), p.leave.deleted)
	if len(going) == 0 {
		p.leave.deleted, p.leave.held = 0, map[string]bool{}
	}
	p.leave.mu.Unlock()
	byOwner := map[string][]object{}
	for _, c := range going {
		owner := rules.Annotation(c, rules.AnnotationOwner)
		byOwner[owner] = append(byOwner[owner], c)
	}
	for owner, cs := range byOwner {
		switch {
		case held:
			lf.hold(p, owner, cs, why)
		case ok:
			lf.deleteLeaving(ctx, p, owner, cs)
		default:
			klog.FromContext(ctx).V(1).Info("Children leaving a cluster wait", "rule", lf.l.rule.Name, "cluster", p.cluster, "why", why)
		}
	}
}

// hold says, once, on owner's trigger that its children leaving p are
// held there.
func (lf *loopFleet) hold(p *place, owner string, cs []object, why string) {
	p.leave.mu.Lock()
	news := !p.leave.held[owner]
	p.leave.held[owner] = true
	p.leave.mu.Unlock()
	key, ok := lf.l.ownTrigger(owner)
	if !ok {
		return
	}
	obj, found, _ := lf.l.watches.trigger.Indexer().GetByKey(key.String())
	if !found {
		return
	}
	lf.l.rc.out.held(wholeOf(obj), leaveHold{cluster: p.cluster, children: cs, why: why, news: news})
}

// deleteLeaving deletes owner's children leaving p, through p's writer:
// each with its UID as the precondition.
func (lf *loopFleet) deleteLeaving(ctx context.Context, p *place, owner string, cs []object) {
	t, ok := rules.ParseOwner(owner)
	if !ok {
		return
	}
	for _, c := range cs {
		ck := p.w.children[c.GetObjectKind().GroupVersionKind()]
		if ck == nil || !childOf(lf.l.rule.Name, owner, c) || !cached(ck, c) {
			continue
		}
		if err := p.rc.out.delete(ctx, ck.mapping, t, c, &changes{}, metav1.DeletePropagationBackground); err != nil {
			p.noAnswer(ctx, err)
			klog.FromContext(ctx).Info("Deleting a child that left its cluster failed; retried", "rule", lf.l.rule.Name, "cluster", p.cluster, "child", klog.KObj(c), "err", err)
			lf.wantSweep()
			continue
		}
		p.leave.mu.Lock()
		p.leave.deleted++
		delete(p.leave.held, owner)
		p.leave.mu.Unlock()
	}
}

// objectRef is obj's reference, for plans.
func objectRef(obj object) rules.ObjectRef {
	gvk := obj.GetObjectKind().GroupVersionKind()
	return rules.ObjectRef{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind, Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

// leaveHold is children of one trigger that leave a cluster and are held
// there: leaveDecision said no.
type leaveHold struct {
	cluster  string
	children []object
	why      string
	// news: the trigger's children there were not held before (an Event
	// says so once).
	news bool
}

func (h leaveHold) String() string {
	return fmt.Sprintf("%d children leaving cluster %q are held there: %s", len(h.children), h.cluster, h.why)
}
