package metrics

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/util/workqueue"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	informers := 3
	ready := []RuleReady{{Rule: "tenant", Ready: true}, {Rule: "secrets", Identity: "team-a/reader"}}
	m := New(reg, func() int { return informers }, func() []RuleReady { return ready }, Known{})
	m.WatchError("secrets", "Forbidden")
	m.WatchError("secrets", "Forbidden")
	m.ReconcileDone("tenant", "success", 20*time.Millisecond)
	m.ReconcileDone("tenant", "success", 30*time.Millisecond)
	m.ReconcileDone("tenant", "error", time.Millisecond)
	m.Write("tenant", "create")
	m.Write("tenant", "unchanged")
	m.Write("tenant", "unchanged")
	m.RulesLoaded(4)
	m.Reloaded(false)
	m.Reloaded(true)
	m.Reloaded(false)
	m.RESTClient().Increment(context.Background(), "200", "PATCH", "127.0.0.1:6443")

	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "tenant", MetricsProvider: m.Workqueue()})
	q.Add("a")
	q.Add("b")
	defer q.ShutDown()

	want := `
# HELP rest_client_requests_total API requests by status code, method and host (past 100 hosts, other).
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="PATCH"} 1
# HELP syncloop_apply_total Children and statuses by rule and action (create, update, adopt, unchanged, delete, status, wait, conflict).
# TYPE syncloop_apply_total counter
syncloop_apply_total{action="create",rule="tenant"} 1
syncloop_apply_total{action="unchanged",rule="tenant"} 2
# HELP syncloop_informers Shared informers running.
# TYPE syncloop_informers gauge
syncloop_informers 3
# HELP syncloop_reconcile_total Reconciles by rule and result (success, error).
# TYPE syncloop_reconcile_total counter
syncloop_reconcile_total{result="error",rule="tenant"} 1
syncloop_reconcile_total{result="success",rule="tenant"} 2
# HELP syncloop_rule_ready 1 when the rule runs; 0 while it waits for a kind the API server does not serve or for informers that cannot sync (see /readyz for why). identity is the ServiceAccount the rule acts as (none: syncloop's own).
# TYPE syncloop_rule_ready gauge
syncloop_rule_ready{identity="team-a/reader",rule="secrets"} 0
syncloop_rule_ready{identity="",rule="tenant"} 1
# HELP syncloop_rules_loaded Rules in force.
# TYPE syncloop_rules_loaded gauge
syncloop_rules_loaded 4
# HELP syncloop_rules_reload_total Loads of the rule files by result: success, or error when a file failed (its last good version stays in force).
# TYPE syncloop_rules_reload_total counter
syncloop_rules_reload_total{result="error"} 1
syncloop_rules_reload_total{result="success"} 2
# HELP syncloop_watch_errors_total Failed lists and watches of an informer by resource and reason (Forbidden: missing RBAC; Expired: etcd compacted, relisting; Unreachable: no answer; past 200 resources and 10 other reasons, other). Each is retried with backoff.
# TYPE syncloop_watch_errors_total counter
syncloop_watch_errors_total{reason="Forbidden",resource="secrets"} 2
# HELP workqueue_adds_total Adds handled by the workqueue.
# TYPE workqueue_adds_total counter
workqueue_adds_total{name="tenant"} 2
# HELP workqueue_depth Current depth of the workqueue.
# TYPE workqueue_depth gauge
workqueue_depth{name="tenant"} 2
`
	names := []string{"rest_client_requests_total", "syncloop_apply_total", "syncloop_informers", "syncloop_reconcile_total", "syncloop_rule_ready", "syncloop_rules_loaded",
		"syncloop_rules_reload_total", "syncloop_watch_errors_total", "workqueue_adds_total", "workqueue_depth"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "syncloop_reconcile_duration_seconds"); n != 1 {
		t.Errorf("%d duration series, want 1", n)
	}
	m.ReconcileDone("gone", "success", time.Millisecond)
	m.Write("gone", "create")
	gq := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gone", MetricsProvider: m.Workqueue()})
	gq.Add("x")
	gq.ShutDown()
	m.RuleRemoved("gone")
	out, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range out {
		for _, metric := range mf.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetValue() == "gone" {
					t.Errorf("%s keeps a series of the removed rule", mf.GetName())
				}
			}
		}
	}
	if n := testutil.CollectAndCount(reg, "syncloop_reconcile_total"); n != 2 {
		t.Errorf("%d syncloop_reconcile_total series after removing another rule, want tenant's 2", n)
	}

	ready = ready[:1] // a removed rule leaves no series
	if n := testutil.CollectAndCount(reg, "syncloop_rule_ready"); n != 1 {
		t.Errorf("%d syncloop_rule_ready series after a rule was removed, want 1", n)
	}
	informers = 5 // read at scrape time
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP syncloop_informers Shared informers running.
# TYPE syncloop_informers gauge
syncloop_informers 5
`), "syncloop_informers"); err != nil {
		t.Error(err)
	}
}

// TestConversionRefusals: every reason a review is refused for is a
// series at 0 from the start, for an alert to rate; a refusal counts.
func TestConversionRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := NewConversions(reg, []string{"too-large", "busy"})
	c.Refused("busy")
	want := `
# HELP syncloop_conversion_reviews_refused_total ConversionReviews the conversion webhook answered without converting them, by reason: too-large (the body, or what decoding an object would hold), busy (429: too many in flight; the API server sends it again), malformed (not a ConversionReview).
# TYPE syncloop_conversion_reviews_refused_total counter
syncloop_conversion_reviews_refused_total{reason="busy"} 1
syncloop_conversion_reviews_refused_total{reason="too-large"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "syncloop_conversion_reviews_refused_total"); err != nil {
		t.Error(err)
	}
}

// TestKnownSeriesAtZero: once a rule has loaded and its informers start,
// every series the chart's alerts and dashboards take the increase of —
// its panics by where, reconciles by result, writes by action (conflict
// among them), its CRD's applies, the watch errors of its resources by
// reason, reloads by result, the panics of a file's load — is there at 0,
// so that the first of each is an increase; the rule's go with it.
func TestKnownSeriesAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	known := Known{Results: []string{"success", "error"}, Writes: []string{"create", "conflict"}, Panics: []string{"reconcile", "crds"},
		CRDResults: []string{"created", "failed"}, UnruledPanics: []string{"load"}, WatchReasons: []string{"Forbidden", "Unreachable"}}
	m := New(reg, func() int { return 0 }, func() []RuleReady { return nil }, known)
	m.RuleLoaded("shop", true)
	m.RuleLoaded("plain", false)
	m.Watching("secrets")
	want := map[string][]string{
		"syncloop_panics_total":       {`rule="",where="load"`, `rule="shop",where="reconcile"`, `rule="shop",where="crds"`, `rule="plain",where="reconcile"`},
		"syncloop_reconcile_total":    {`result="success",rule="shop"`, `result="error",rule="shop"`, `result="error",rule="plain"`},
		"syncloop_apply_total":        {`action="conflict",rule="shop"`, `action="create",rule="plain"`},
		"syncloop_crd_apply_total":    {`result="created",rule="shop"`, `result="failed",rule="shop"`},
		"syncloop_watch_errors_total": {`reason="Forbidden",resource="secrets"`, `reason="Unreachable",resource="secrets"`},
		"syncloop_rules_reload_total": {`result="error"`, `result="success"`},
	}
	for family, keys := range want {
		got, sum := series(t, reg, family)
		have := map[string]bool{}
		for _, l := range got {
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(l)) {
				parts = append(parts, k+`="`+l[k]+`"`)
			}
			have[strings.Join(parts, ",")] = true
		}
		for _, k := range keys {
			if !have[strings.Join(slices.Sorted(slices.Values(strings.Split(k, ","))), ",")] {
				t.Errorf("%s{%s} is not there at 0: %v", family, k, have)
			}
		}
		if sum != 0 {
			t.Errorf("%s sums to %v before anything was counted", family, sum)
		}
	}
	if n := testutil.CollectAndCount(reg, "syncloop_crd_apply_total"); n != 2 {
		t.Errorf("%d syncloop_crd_apply_total series, want shop's 2: a rule that defines no kind has none", n)
	}
	if n := testutil.CollectAndCount(reg, "syncloop_reconcile_duration_seconds"); n != 2 {
		t.Errorf("%d reconcile duration series, want one per rule", n)
	}
	m.RuleRemoved("shop")
	for _, family := range []string{"syncloop_panics_total", "syncloop_crd_apply_total", "syncloop_reconcile_total"} {
		got, _ := series(t, reg, family)
		for _, l := range got {
			if l["rule"] == "shop" {
				t.Errorf("%s keeps a series of the removed rule: %v", family, l)
			}
		}
	}
}
