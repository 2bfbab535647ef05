package render

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/syncloop/syncloop/rules"
)

// ClusterLister knows the cluster inventory: the engine's (kubeconfig
// Secrets), or the clusters an offline render is given. A render without
// one selects no cluster.
type ClusterLister interface {
	// Clusters are the clusters of the inventory, by name.
	Clusters() []rules.Cluster
}

// ReasonClusterUnreachable: a child could not be brought about in a
// cluster it goes to (not reachable, or not in the inventory); it waits
// there, as it is, and nothing is pruned there.
const ReasonClusterUnreachable = "ClusterUnreachable"

// UnreachableError is what an Applier returns for a child whose cluster it
// cannot reach now: its resource is not ready, the Ready condition says
// ClusterUnreachable, and the reconcile does not fail for it.
type UnreachableError struct {
	Cluster string
	Why     string
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cluster %q is not reachable: %s", e.Cluster, e.Why)
}

// ReasonRolloutPending: a rollout by cluster (spec.rollout.clusters) has
// not reached a cluster the trigger's children go to yet: they stay there
// as the previous revision made them.
const ReasonRolloutPending = "RolloutPending"

// HeldError is what an Applier returns for a child in a cluster a rollout
// by cluster has not reached yet: nothing there is applied or pruned, the
// reconcile does not fail for it, and once everything else is ready the
// Ready condition says RolloutPending.
type HeldError struct {
	Cluster string
	Why     string
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("the rollout has not reached cluster %q yet: %s", e.Cluster, e.Why)
}

// target is one place a resource's children go: a cluster of the
// inventory, or syncloop's own (Name "", Cluster nil).
type target struct {
	Name    string
	Cluster *rules.Cluster
}

// clusters are the places res's children go: syncloop's own cluster for a
// resource that targets none; otherwise the inventory's clusters its
// selector holds for, or that its names name, by name. A name the
// inventory lacks makes res not ready (ClusterUnreachable).
func (w *graphWalk) clusters(ctx context.Context, res *rules.Resource, st *ResourceState) ([]target, error) {
	cl := res.Clusters
	if cl == nil {
		return []target{{}}, nil
	}
	var inventory []rules.Cluster
	if w.in.Clusters != nil {
		inventory = w.in.Clusters.Clusters()
	}
	var out []target
	if cl.Selector != nil {
		for i := range inventory {
			c := &inventory[i]
			act := *w.rd.act
			act.Cluster = c.Value()
			ok, err := cl.Selector.EvalBool(ctx, &act)
			if err != nil {
				return nil, exprError(w.in.Rule, cl.Selector, res.ID, err)
			}
			if ok {
				out = append(out, target{Name: c.Name, Cluster: c})
			}
		}
	} else {
		var names []string
		for _, t := range cl.Names {
			name, err := textValue(ctx, w.in.Rule, t, w.rd.act)
			if err != nil {
				return nil, err
			}
			if name != "" {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range slices.Compact(names) {
			i := slices.IndexFunc(inventory, func(c rules.Cluster) bool { return c.Name == name })
			if i < 0 {
				st.Unreachable = appendNew(st.Unreachable, name)
				why := (&UnreachableError{Cluster: name, Why: "it is not in the inventory"}).Error()
				w.notReady(st, why)
				w.rd.clusterNotReady(name, why)
				if w.offline {
					w.rd.note(res, "%s: cluster %q is not among the kubeconfig Secrets given: its children there are not rendered", cl.Field, name)
				}
				continue
			}
			out = append(out, target{Name: name, Cluster: &inventory[i]})
		}
	}
	for _, t := range out {
		st.Clusters = append(st.Clusters, t.Name)
	}
	st.Clusters = append(st.Clusters, st.Unreachable...)
	slices.Sort(st.Clusters)
	if w.offline && len(out) == 0 && len(st.Unreachable) == 0 {
		w.rd.note(res, "%s: no cluster given offline is selected: rendered no children", cl.Field)
	}
	return out, nil
}

// Selected are the clusters of the inventory the resources that target
// clusters selected, by resource id and then name; and the clusters where
// their children wait, as they are: not reachable, or not reached by a
// rollout yet.
func (rd *Rendered) Selected() (selected map[string][]string, waiting []string) {
	selected = map[string][]string{}
	for _, c := range rd.Children {
		if c.Cluster != "" && !slices.Contains(selected[c.ResourceID], c.Cluster) {
			selected[c.ResourceID] = append(selected[c.ResourceID], c.Cluster)
		}
	}
	for _, st := range rd.Resources {
		for _, c := range append(slices.Clip(st.Unreachable), st.Held...) {
			waiting = appendNew(waiting, c)
		}
	}
	slices.Sort(waiting)
	return selected, waiting
}

// unreachable are the clusters the render's children could not be
// brought about in.
func (rd *Rendered) unreachable() []string {
	var out []string
	for _, st := range rd.Resources {
		for _, c := range st.Unreachable {
			out = appendNew(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// clusterNotes are, by cluster of the fleet, why the first of the
// trigger's children there that is not ready is not (notReady), and why
// its children there wait for a rollout by cluster (held).
type clusterNotes struct {
	notReady, held map[string]string
}

// clusterHeld notes that cluster's children wait for the rollout, and
// why, unless a child there is not ready for another reason already.
func (rd *Rendered) clusterHeld(cluster, why string) {
	if rd.inClusters.held == nil {
		rd.inClusters.held = map[string]string{}
	}
	if _, ok := rd.inClusters.held[cluster]; !ok {
		rd.inClusters.held[cluster] = why
	}
}

// pendingCondition is the Ready condition of a render whose children are
// all ready but in clusters a rollout by cluster has not reached yet; ok
// false when there are none.
func (rd *Rendered) pendingCondition() (Condition, bool) {
	if len(rd.inClusters.held) == 0 {
		return Condition{}, false
	}
	clusters := slices.Sorted(maps.Keys(rd.inClusters.held))
	return Condition{Status: false, Reason: ReasonRolloutPending,
		Message: fmt.Sprintf("the rollout of the rule's new revision has not reached cluster %s yet: the children there are as the previous revision made them", quotedList(clusters))}, true
}

// clusterNotReady notes why a child in cluster is not ready, if it is
// the first there ("": syncloop's own cluster, not noted).
func (rd *Rendered) clusterNotReady(cluster, why string) {
	if cluster == "" {
		return
	}
	if rd.inClusters.notReady == nil {
		rd.inClusters.notReady = map[string]string{}
	}
	if _, ok := rd.inClusters.notReady[cluster]; !ok {
		rd.inClusters.notReady[cluster] = why
	}
}

// ReasonChildrenNotReady: a child in a cluster of the fleet does not
// exist or is not ready (readyWhen) yet.
const ReasonChildrenNotReady = "ChildrenNotReady"

// ClusterStates are what is where in the fleet, as a status reads it
// (clusters): each cluster the trigger's resources select, by name, with
// whether its children there are all ready and, when not, why
// (ClusterUnreachable: it does not answer; ChildrenNotReady: a child
// there is missing or not ready). Empty for a rule that targets none.
func (rd *Rendered) ClusterStates() []any {
	var names, unreachable []string
	for _, st := range rd.Resources {
		if st.Excluded {
			continue
		}
		for _, c := range st.Clusters {
			names = appendNew(names, c)
		}
		for _, c := range st.Unreachable {
			unreachable = appendNew(unreachable, c)
		}
	}
	slices.Sort(names)
	out := make([]any, 0, len(names))
	for _, name := range names {
		c := map[string]any{"name": name, "ready": true}
		if why, ok := rd.inClusters.notReady[name]; ok {
			c["ready"], c["reason"], c["message"] = false, ReasonChildrenNotReady, why
			if slices.Contains(unreachable, name) {
				c["reason"] = ReasonClusterUnreachable
			}
		} else if why, ok := rd.inClusters.held[name]; ok {
			c["ready"], c["reason"], c["message"] = false, ReasonRolloutPending, why
		}
		out = append(out, c)
	}
	return out
}

// unreachableCondition is the Ready condition of a render some of whose
// children wait for clusters it could not reach; ok false when none do.
func (rd *Rendered) unreachableCondition() (Condition, bool) {
	clusters := rd.unreachable()
	if len(clusters) == 0 {
		return Condition{}, false
	}
	var ids []string
	for _, st := range rd.Resources {
		if len(st.Unreachable) > 0 {
			ids = append(ids, st.Resource.ID)
		}
	}
	return Condition{Status: false, Reason: ReasonClusterUnreachable,
		Message: fmt.Sprintf("cluster %s not reachable: the children of %s wait there, as they are", quotedList(clusters), quotedList(ids))}, true
}

func quotedList(s []string) string { return strings.Join(quoted(s), ", ") }

// inCluster says where a child is, for messages: "" in syncloop's own
// cluster.
func inCluster(cluster string) string {
	if cluster == "" {
		return ""
	}
	return fmt.Sprintf(" in cluster %q", cluster)
}

func appendNew(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
