package metrics

import "github.com/prometheus/client_golang/prometheus"

// Fleet are the cluster inventory's metrics (internal/fleet).
type Fleet struct {
	invalid *prometheus.CounterVec
}

// NewFleet registers the cluster inventory's metrics on reg: clusters
// counts the clusters of the inventory, unreachable those that do not
// answer now.
func NewFleet(reg prometheus.Registerer, clusters, unreachable func() int) *Fleet {
	f := &Fleet{invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncloop_cluster_kubeconfig_errors_total", Help: "Kubeconfig Secrets of the cluster inventory that made no client (a Warning Event BadKubeconfig on the Secret says why), by cluster: the cluster is left out until the Secret is fixed.",
	}, []string{"cluster"})}
	reg.MustRegister(f.invalid,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "syncloop_clusters", Help: "Clusters in the inventory (kubeconfig Secrets) that rules may put children in.",
		}, func() float64 { return float64(clusters()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "syncloop_clusters_unreachable", Help: "Clusters of the inventory that do not answer now: their children wait there, as they are (Ready reason ClusterUnreachable).",
		}, func() float64 { return float64(unreachable()) }))
	return f
}

// KubeconfigInvalid implements fleet.Metrics.
func (f *Fleet) KubeconfigInvalid(cluster string) { f.invalid.WithLabelValues(cluster).Inc() }
