package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Fleet are the cluster inventory's metrics (internal/fleet).
type Fleet struct {
	invalid *prometheus.CounterVec
	// clusters bounds invalid's cluster: a name is a kubeconfig Secret's
	// label, which whoever may write Secrets there makes up.
	clusters *bounded
}

// NewFleet registers the cluster inventory's metrics on reg: clusters
// counts the clusters of the inventory, unreachable those that do not
// answer now, answering says of each cluster whether it does.
func NewFleet(reg prometheus.Registerer, clusters, unreachable func() int, answering func() map[string]bool) *Fleet {
	f := &Fleet{clusters: newBounded(MaxClusters), invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncloop_cluster_kubeconfig_errors_total", Help: fmt.Sprintf("Kubeconfig Secrets of the cluster inventory that made no client, or whose API server is an older Secret's cluster already (a Warning Event BadKubeconfig on the Secret says why), by cluster (past %d clusters, %s): the cluster is left out until the Secret is fixed.", MaxClusters, Other),
	}, []string{"cluster"})}
	reg.MustRegister(f.invalid,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "syncloop_clusters", Help: "Clusters in the inventory (kubeconfig Secrets) that rules may put children in.",
		}, func() float64 { return float64(clusters()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "syncloop_clusters_unreachable", Help: "Clusters of the inventory that do not answer now: their children wait there, as they are (Ready reason ClusterUnreachable).",
		}, func() float64 { return float64(unreachable()) }),
		clusterUp{answering})
	return f
}

// clusterUp is syncloop_cluster_up, one series per cluster of the
// inventory as it is when scraped: a cluster that leaves it leaves the
// metric.
type clusterUp struct{ answering func() map[string]bool }

var clusterUpDesc = prometheus.NewDesc("syncloop_cluster_up",
	"Whether each cluster of the inventory answers (1) or not (0): while it does not, its children wait there as they are.", []string{"cluster"}, nil)

func (c clusterUp) Describe(ch chan<- *prometheus.Desc) { ch <- clusterUpDesc }

func (c clusterUp) Collect(ch chan<- prometheus.Metric) {
	for name, up := range c.answering() {
		v := 0.0
		if up {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(clusterUpDesc, prometheus.GaugeValue, v, name)
	}
}

// KubeconfigInvalid implements fleet.Metrics; the cluster is bounded:
// MaxClusters.
func (f *Fleet) KubeconfigInvalid(cluster string) {
	f.invalid.WithLabelValues(f.clusters.value("", cluster)).Inc()
}
