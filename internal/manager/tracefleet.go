package manager

import (
	"cmp"
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// tracedFleet is the fleet as a trace reads it: the kubeconfig Secrets
// listed once, and the clusters found not answering (or whose children
// could not be listed): their children are not reachable, as a reconcile
// would find them. A nil *tracedFleet has no cluster.
type tracedFleet struct {
	inv  *fleet.Inventory
	down map[string]error
}

// traceFleet reads the fleet if a rule of ruleSet targets clusters: the
// kubeconfig Secrets in o.ClustersNamespace (default: syncloop's).
func traceFleet(ctx context.Context, c *Clients, o TraceOptions, ruleSet []tracedRule) (*tracedFleet, error) {
	if !slices.ContainsFunc(ruleSet, func(tr tracedRule) bool { return tr.rule.TargetsClusters() }) {
		return nil, nil
	}
	inv := newInventory(c, cmp.Or(o.ClustersNamespace, o.SyncloopNamespace), nil, nil)
	if err := inv.Load(ctx); err != nil {
		return nil, err
	}
	return &tracedFleet{inv: inv, down: map[string]error{}}, nil
}

// Clusters are the clusters of the fleet, by name.
func (f *tracedFleet) Clusters() []rules.Cluster {
	if f == nil {
		return nil
	}
	return f.inv.Clusters()
}

// reach is how to reach cluster, or why it cannot be.
func (f *tracedFleet) reach(cluster string) (dynamic.Remote, error) {
	if err := f.unreachable(cluster); err != nil {
		return dynamic.Remote{}, err
	}
	r, _ := f.inv.Reach(cluster)
	return r, nil
}

// failed notes that cluster's children could not be read.
func (f *tracedFleet) failed(cluster string, err error) { f.down[cluster] = err }

// unreachable is why the children in cluster cannot be read, or nil ("":
// syncloop's own cluster, always read).
func (f *tracedFleet) unreachable(cluster string) error {
	switch {
	case cluster == "":
		return nil
	case f == nil:
		return &render.UnreachableError{Cluster: cluster, Why: "no kubeconfig Secrets were read"}
	case f.down[cluster] != nil:
		return &render.UnreachableError{Cluster: cluster, Why: f.down[cluster].Error()}
	}
	if _, ok := f.inv.Reach(cluster); !ok {
		return &render.UnreachableError{Cluster: cluster, Why: "it is not in the inventory"}
	}
	return nil
}

// scoper is the Scoper of a trace's render: syncloop's own cluster's
// mapper, and for a kind it does not serve, the fleet's clusters' (as the
// engine's fleetScoper).
func (f *tracedFleet) scoper(home render.Scoper) render.Scoper {
	if f == nil {
		return home
	}
	return traceScoper{home: home, f: f}
}

type traceScoper struct {
	home render.Scoper
	f    *tracedFleet
}

func (s traceScoper) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	namespaced, err := s.home.Namespaced(gvk)
	if err == nil {
		return namespaced, nil
	}
	for _, c := range s.f.Clusters() {
		if r, rerr := s.f.reach(c.Name); rerr == nil {
			if namespaced, perr := r.Mapper.Namespaced(gvk); perr == nil {
				return namespaced, nil
			}
		}
	}
	return false, err
}
