package metrics

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series are the series of family name on reg, each as its labels, and
// the sum of their values.
func series(t *testing.T, reg *prometheus.Registry, name string) (labels []map[string]string, sum float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			labels = append(labels, l)
			sum += m.GetCounter().GetValue()
		}
	}
	return labels, sum
}

// TestDriftManagersBounded: 10,000 field managers, each repairing a
// child of one rule once, make MaxManagers series of their own and one
// "other", not 10,000, and every repair is counted; a well-known writer
// is named even after they have taken the bound, and another rule has a
// bound of its own. A removed rule's managers are forgotten with it.
func TestDriftManagersBounded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, func() int { return 0 }, func() []RuleReady { return nil }, Known{})
	const n = 10000
	for i := range n {
		m.DriftRepaired("tenant", fmt.Sprintf("attacker-%d", i))
	}
	m.DriftRepaired("tenant", "kubectl-edit")
	m.DriftRepaired("tenant", "attacker-3") // admitted before the bound: named still
	m.DriftRepaired("other-rule", "attacker-9999")
	got, sum := series(t, reg, "syncloop_drift_repairs_total")
	byRule := map[string]map[string]bool{}
	for _, l := range got {
		if byRule[l["rule"]] == nil {
			byRule[l["rule"]] = map[string]bool{}
		}
		byRule[l["rule"]][l["manager"]] = true
	}
	if len(byRule["tenant"]) != MaxManagers+2 || !byRule["tenant"][Other] || !byRule["tenant"]["kubectl-edit"] || !byRule["tenant"]["attacker-3"] {
		t.Errorf("rule tenant has %d series, want %d (the first %d managers, kubectl-edit, other): %v", len(byRule["tenant"]), MaxManagers+2, MaxManagers, byRule["tenant"])
	}
	if !byRule["other-rule"]["attacker-9999"] {
		t.Errorf("another rule's first manager is not named: %v", byRule["other-rule"])
	}
	if sum != n+3 {
		t.Errorf("the repairs sum to %v, want %d: none is lost", sum, n+3)
	}

	m.RuleRemoved("tenant")
	m.DriftRepaired("tenant", "attacker-10000")
	if got, _ := series(t, reg, "syncloop_drift_repairs_total"); len(got) != 2 {
		t.Errorf("after the rule was removed and came back: %v, want its new first manager and other-rule's", got)
	}
}

// TestOthersLabelsBounded: the resources and the reasons of watch errors
// (a remote API server makes up its reasons), the clusters of kubeconfig
// Secrets and the hosts of API requests (each a Secret's to name) make a
// bounded number of series however many values come; the reasons known
// in advance are named whatever came before.
func TestOthersLabelsBounded(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, func() int { return 0 }, func() []RuleReady { return nil }, Known{WatchReasons: []string{"Forbidden"}})
	f := NewFleet(reg, func() int { return 0 }, func() int { return 0 }, func() map[string]bool { return nil })
	const n = 10000
	rest := m.RESTClient()
	for i := range n {
		m.WatchError(fmt.Sprintf("things%d.evil.example", i), fmt.Sprintf("Reason%d", i))
		f.KubeconfigInvalid(fmt.Sprintf("cluster-%d", i))
		rest.Increment(context.Background(), "200", "GET", fmt.Sprintf("10.0.%d.%d:6443", i/256, i%256))
	}
	m.WatchError("secrets", "Forbidden")
	for _, tc := range []struct {
		family string
		max    int
	}{
		{"syncloop_watch_errors_total", (MaxResources + 1) * (MaxReasons + 2)},
		{"syncloop_cluster_kubeconfig_errors_total", MaxClusters + 1},
		{"rest_client_requests_total", MaxHosts + 1},
	} {
		got, sum := series(t, reg, tc.family)
		if len(got) > tc.max || len(got) < 2 {
			t.Errorf("%s: %d series from %d values, want at most %d", tc.family, len(got), n, tc.max)
		}
		if sum < n {
			t.Errorf("%s: the counts sum to %v, want %d at least: none is lost", tc.family, sum, n)
		}
	}
	got, _ := series(t, reg, "syncloop_watch_errors_total")
	named := false
	for _, l := range got {
		named = named || l["reason"] == "Forbidden" && l["resource"] == Other
	}
	if !named {
		t.Errorf("a reason known in advance is not named once the bound is taken: %v", got[len(got)-3:])
	}
}
