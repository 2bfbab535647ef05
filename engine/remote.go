package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// One reconcile across clusters: a child the render puts in another
// cluster is applied there by that cluster's place, with the same
// decisions as at home (create-only applies, takeover, drift, fights);
// what is pruned there follows the trigger's selection; a cluster that
// cannot be reached is left as it is — nothing there is applied, pruned
// or recreated — and the trigger's Ready condition names it.

// unreachableAgain is when a trigger whose children wait for a cluster is
// reconciled again, besides when the cluster answers again.
const unreachableAgain = 30 * time.Second

// applyRemote applies a child that goes to another cluster, in its
// place; a cluster not reachable is a *render.UnreachableError, which
// does not fail the reconcile.
func (a *applier) applyRemote(ctx context.Context, child render.Child) (map[string]any, error) {
	if err := a.rc.held(child); err != nil {
		return nil, err
	}
	p, uerr := a.rc.placeOf(child.Cluster)
	if uerr != nil {
		return nil, a.waitFor(child, uerr)
	}
	ref := refOf(child.Object)
	if a.remote == nil {
		a.remote = map[string]map[childRef]bool{}
	}
	if a.remote[child.Cluster] == nil {
		a.remote[child.Cluster] = map[childRef]bool{}
	}
	a.remote[child.Cluster][ref] = true
	release, ok := p.take(ctx)
	if !ok {
		return nil, a.waitFor(child, p.busy())
	}
	defer release()
	out, err := p.rc.applyChild(ctx, a.ch, a.trigger, child)
	if dynamic.NoAnswer(err) && ctx.Err() == nil {
		p.noAnswer(ctx, err)
		return nil, a.waitFor(child, &render.UnreachableError{Cluster: child.Cluster, Why: err.Error()})
	}
	return out, err
}

// waitFor leaves child as it is in a cluster it cannot reach now, says
// so (a plan lists it as waiting), and returns why.
func (a *applier) waitFor(child render.Child, ue *render.UnreachableError) *render.UnreachableError {
	a.unreachable = true
	a.rc.out.unreachable(a.trigger, child, ue)
	return ue
}

// placeOf is the place of cluster, or why it cannot be reached.
func (rc *reconciler) placeOf(cluster string) (*place, *render.UnreachableError) {
	if rc.fleet == nil {
		return nil, &render.UnreachableError{Cluster: cluster, Why: "syncloop runs without a cluster inventory (--clusters-namespace)"}
	}
	return rc.fleet.placeOf(cluster)
}

// observedRemote is a child in another cluster as its place's caches
// hold it, if it is this trigger's child; nil otherwise.
func (a *applier) observedRemote(child render.Child) map[string]any {
	p, err := a.rc.placeOf(child.Cluster)
	if err != nil {
		return nil
	}
	return (&applier{rc: p.rc, owner: a.owner}).Observed(render.Child{ResourceID: child.ResourceID, Object: child.Object, Resource: child.Resource})
}

// pruneRemote prunes, in every cluster that can be reached, the trigger's
// children there that rd does not want: those of a resource that is no
// longer in the rule, no longer targets clusters or is not wanted, and
// those of a resource whose selection still holds the cluster. The
// children of a resource whose selection left a cluster stay there as
// they are (orphaned: a relabelled or mislabelled cluster never deletes
// workloads); with onLeave: Delete the selection is told to the place,
// whose sweep deletes them within the rule's prune budget there
// (leave.go). Those of a resource that waits stay too. rd nil: the
// trigger wants no children (gone, or its when is false): all go.
func (rc *reconciler) pruneRemote(ctx context.Context, ch *changes, ref rules.ObjectRef, owner string, rd *render.Rendered, desired map[string]map[childRef]bool, waiting map[string]bool) error {
	if rc.fleet == nil {
		return nil
	}
	var waitedIn []string // clusters this render's children found unreachable
	if rd != nil {
		_, waitedIn = rd.Selected()
	}
	var errs []error
	for _, p := range rc.fleet.each() {
		if p.unreachable() != nil || slices.Contains(waitedIn, p.cluster) {
			// Its children wait there, as they are — also when it
			// answered again since the render found it not answering:
			// what the render wants there was never marked.
			continue
		}
		want, keep, leaving := remoteWant(rd, p.cluster, desired[p.cluster], waiting)
		if rd == nil {
			p.leave.forget(owner)
		} else if p.leave.tell(owner, leaving, waiting) {
			rc.fleet.wantSweep()
		}
		existing := p.rc.childrenOf(owner)
		if len(existing) == 0 {
			continue
		}
		if err := p.pruneIn(ctx, ch, ref, owner, existing, want, keep); err != nil {
			errs = append(errs, fmt.Errorf("in cluster %q: %w", p.cluster, err))
		}
	}
	return errors.Join(errs...)
}

// pruneIn prunes the trigger's children in p's cluster that are not in
// want, holding one of p's slots: none free, it fails (the trigger is
// tried again), and the children stay as they are meanwhile.
func (p *place) pruneIn(ctx context.Context, ch *changes, ref rules.ObjectRef, owner string, existing []object, want map[childRef]bool, keep map[string]bool) error {
	release, ok := p.take(ctx)
	if !ok {
		return p.busy()
	}
	defer release()
	err := p.rc.prune(ctx, ch, ref, owner, existing, want, keep)
	p.noAnswer(ctx, err)
	return err
}

// remoteWant is what a reconcile that rendered rd keeps of the trigger's
// children in cluster: want, those wanted there (desired; nil when rd is
// nil: none); keep, the resources whose children there stay as they are —
// those that wait, and those whose selection left the cluster (orphaned,
// or with onLeave: Delete the sweep's: leaving).
func remoteWant(rd *render.Rendered, cluster string, desired map[childRef]bool, waiting map[string]bool) (want map[childRef]bool, keep, leaving map[string]bool) {
	keep = map[string]bool{}
	for id := range waiting {
		keep[id] = true
	}
	if rd == nil {
		return nil, keep, nil
	}
	want = desired
	if want == nil {
		want = map[childRef]bool{}
	}
	for _, st := range rd.Resources {
		res := st.Resource
		if res.Targets() && !st.Excluded && !waiting[res.ID] && !slices.Contains(st.Clusters, cluster) {
			keep[res.ID] = true // left the selection: orphaned, or the sweep's
			if res.Clusters.OnLeave == rules.DeletionDelete {
				leaving = setOf(leaving, res.ID)
			}
		}
	}
	return want, keep, leaving
}

// remotePrunes counts the trigger's children, in the clusters that can be
// reached, that a reconcile rendering rd (nil or skipped: it wants none)
// would prune there — as the caches hold them, for a rollout's prune
// budget. Those leaving a cluster go through the sweep's own budget.
func (rc *reconciler) remotePrunes(ctx context.Context, owner string, rd *render.Rendered, waiting map[string]bool) int {
	if rc.fleet == nil {
		return 0
	}
	if rd != nil && rd.Skipped {
		rd = nil
	}
	desired := map[string]map[childRef]bool{}
	if rd != nil {
		for _, c := range rd.Children {
			if c.Cluster != "" {
				desired[c.Cluster] = setOf(desired[c.Cluster], refOf(c.Object))
			}
		}
	}
	n := 0
	for _, p := range rc.fleet.each() {
		existing := p.rc.childrenOf(owner)
		if p.unreachable() != nil || len(existing) == 0 {
			continue
		}
		want, keep, _ := remoteWant(rd, p.cluster, desired[p.cluster], waiting)
		n += len(p.rc.prunable(ctx, owner, existing, want, keep, false))
	}
	return n
}

// remoteChildren reports whether the trigger has children in a cluster
// that can be reached (as the caches there hold them).
func (rc *reconciler) remoteChildren(owner string) bool {
	if rc.fleet == nil {
		return false
	}
	for _, p := range rc.fleet.each() {
		if p.unreachable() == nil && len(p.rc.childrenOf(owner)) > 0 {
			return true
		}
	}
	return false
}

// remoteDoomed are, per place, the trigger's children a teardown deletes
// there, and the clusters it cannot tell (not reachable): the teardown
// waits for them, holding the trigger.
func (rc *reconciler) remoteDoomed(ctx context.Context, owner string) (doomed map[*place][]object, waitingFor []string) {
	if rc.fleet == nil {
		return nil, nil
	}
	doomed = map[*place][]object{}
	for _, p := range rc.fleet.each() {
		if p.unreachable() != nil {
			waitingFor = append(waitingFor, p.cluster)
			continue
		}
		if d := p.rc.prunable(ctx, owner, p.rc.childrenOf(owner), nil, nil, true); len(d) > 0 {
			doomed[p] = d
		}
	}
	return doomed, waitingFor
}

// ClusterWaitError is a teardown that cannot go on: clusters where the
// trigger may have children do not answer. The trigger stays held.
type ClusterWaitError struct{ Clusters []string }

func (e *ClusterWaitError) Error() string {
	return fmt.Sprintf("the trigger's children in cluster %s are deleted before the trigger is let go, and it does not answer", strings.Join(quoteAll(e.Clusters), ", "))
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
