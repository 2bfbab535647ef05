package manager

import (
	"context"
	"slices"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
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
// kubeconfig Secrets in o.Clusters.Namespace (default: syncloop's).
func traceFleet(ctx context.Context, c *Clients, o TraceOptions, ruleSet []tracedRule) (*tracedFleet, error) {
	if !slices.ContainsFunc(ruleSet, func(tr tracedRule) bool { return tr.rule.TargetsClusters() }) {
		return nil, nil
	}
	inv := newInventory(c, o.Clusters, o.SyncloopNamespace, nil, nil)
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
		why := "it is not in the inventory"
		if err := f.inv.LeftOut(cluster); err != nil {
			why = err.Error()
		}
		return &render.UnreachableError{Cluster: cluster, Why: why}
	}
	return nil
}

// scoper is the Scoper of a trace's render of r: the engine's
// (engine.FleetScoper), over the mappers of the clusters it can reach.
func (f *tracedFleet) scoper(home render.Scoper, r *rules.Rule) render.Scoper {
	if f == nil {
		return home
	}
	return engine.FleetScoper(home, r, func() []render.Scoper {
		var out []render.Scoper
		for _, c := range f.Clusters() {
			if remote, err := f.reach(c.Name); err == nil {
				out = append(out, remote.Mapper)
			}
		}
		return out
	})
}
