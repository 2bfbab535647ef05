package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFleetMetrics: one syncloop_cluster_up series per cluster of the
// inventory as it is when scraped; a cluster that leaves it leaves the
// metric.
func TestFleetMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	answering := map[string]bool{"east": true, "west": false}
	f := NewFleet(reg, func() int { return len(answering) }, func() int { return 1 }, func() map[string]bool { return answering })
	f.KubeconfigInvalid("north")
	want := `
# HELP syncloop_cluster_up Whether each cluster of the inventory answers (1) or not (0): while it does not, its children wait there as they are.
# TYPE syncloop_cluster_up gauge
syncloop_cluster_up{cluster="east"} 1
syncloop_cluster_up{cluster="west"} 0
# HELP syncloop_clusters_unreachable Clusters of the inventory that do not answer now: their children wait there, as they are (Ready reason ClusterUnreachable).
# TYPE syncloop_clusters_unreachable gauge
syncloop_clusters_unreachable 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "syncloop_cluster_up", "syncloop_clusters_unreachable"); err != nil {
		t.Error(err)
	}
	delete(answering, "west")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP syncloop_cluster_up Whether each cluster of the inventory answers (1) or not (0): while it does not, its children wait there as they are.
# TYPE syncloop_cluster_up gauge
syncloop_cluster_up{cluster="east"} 1
`), "syncloop_cluster_up"); err != nil {
		t.Errorf("after west left: %v", err)
	}
}
