package engine

import (
	"context"
	"slices"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// A rollout by cluster (spec.rollout.clusters): every trigger is on the
// new revision from the first step, and the new revision reaches the
// clusters of the fleet step by step. In a cluster it has not reached,
// the children the previous revision made stay as they are — nothing is
// applied, pruned or deleted for leaving there — and the trigger's Ready
// says RolloutPending once all else is ready. A step is done when every
// trigger, reconciled since it began, has its children ready at home and
// in the clusters reached; it fails, halts or rolls back as a step by
// trigger does. A rollback puts every trigger back on the previous
// revision, which reaches every cluster.

// heldBack says why the rollout by cluster under way keeps rc, the new
// revision's reconciler, out of cluster for now; "" when it does not.
func (lf *loopFleet) heldBack(rc *reconciler, cluster string) string {
	l := lf.l
	ro := l.ro.Load()
	if ro == nil || rc != l.rc {
		return ""
	}
	s := ro.co.Settings()
	if !s.ByCluster() {
		return ""
	}
	inventory := lf.fleet.Clusters()
	i := slices.IndexFunc(inventory, func(c rules.Cluster) bool { return c.Name == cluster })
	if i < 0 {
		return "" // not in the inventory: its children wait for it anyway
	}
	rec := ro.co.Record()
	return rec.HeldFrom(context.Background(), s, inventory[i])
}

// held is, for a child that goes to another cluster, the HeldError of a
// rollout by cluster that has not reached it yet; nil otherwise.
func (rc *reconciler) held(child render.Child) error {
	if child.Cluster == "" || rc.fleet == nil {
		return nil
	}
	if why := rc.fleet.heldBack(rc, child.Cluster); why != "" {
		return &render.HeldError{Cluster: child.Cluster, Why: why}
	}
	return nil
}

// StepClusters are the clusters of the inventory the rule may target that
// step i of a rollout by cluster under s reaches.
func (h rolloutHost) StepClusters(s rules.Rollout, i int) []string {
	lf := h.l.fleet
	if lf == nil {
		return nil
	}
	var out []string
	for _, c := range lf.fleet.Clusters() {
		if lf.mayTarget(c) && s.ClusterStep(context.Background(), c) == i {
			out = append(out, c.Name)
		}
	}
	slices.Sort(out)
	return out
}
