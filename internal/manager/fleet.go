package manager

import (
	"cmp"
	"context"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/internal/metrics"
)

// newInventory is the cluster inventory of the kubeconfig Secrets in
// o.Namespace (home's when empty): clients to the clusters rules put
// children in, made with the client-side limits of syncloop's own (cfg),
// of kubeconfigs that do no more than o.Trust allows. It lists nothing
// until a rule targets clusters.
func newInventory(c *Clients, o Clusters, home string, recorder record.EventRecorder, m fleet.Metrics) *fleet.Inventory {
	own := c.Config
	return fleet.New(c.Core, cmp.Or(o.Namespace, home), fleet.Options{Recorder: recorder, Metrics: m, Trust: o.Trust, Bounds: dynamic.Bounds{Timeout: o.RequestTimeout}, Configure: func(cfg *rest.Config) {
		cfg.QPS, cfg.Burst, cfg.UserAgent = own.QPS, own.Burst, own.UserAgent
	}})
}

// fleetMetrics registers the metrics of p's inventory, read from p.fleet
// when scraped (it is made with them).
func fleetMetrics(p *process) *metrics.Fleet {
	return metrics.NewFleet(p.reg, func() int { return len(p.fleet.Clusters()) }, func() int { return len(p.fleet.Unreachable()) },
		func() map[string]bool {
			out := map[string]bool{}
			for _, st := range p.fleet.Statuses() {
				out[st.Name] = st.Down == nil
			}
			return out
		})
}

// clusterLines are the lines of /readyz about the clusters of inv: each
// answers, or why not. A cluster that does not answer does not make
// syncloop unready: its children wait there, the others go on.
func clusterLines(inv *fleet.Inventory) []string {
	if inv == nil {
		return nil
	}
	var out []string
	for _, st := range inv.Statuses() {
		line := "cluster " + st.Name + ": answering"
		if st.Down != nil {
			line = fmt.Sprintf("cluster %s: not answering, its children wait there as they are: %v", st.Name, st.Down)
		}
		out = append(out, line)
	}
	return out
}

// runInventory runs inv until ctx ends, in the background.
func runInventory(ctx context.Context, inv *fleet.Inventory) { go inv.Run(ctx) }
