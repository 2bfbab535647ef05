package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/internal/webhook"
)

// TestChartDashboardsAndAlerts renders the chart with the Grafana dashboard
// and the PrometheusRule on (helm template checks the values against the
// chart's schema), parses every PromQL expression of both with
// Prometheus' own parser, and checks that every metric they name is one
// syncloop exports: on the /metrics of a syncloop that reconciled a
// trigger, or among the families syncloop registers. Every counter they
// take the rate or increase of is on that /metrics already, at 0 for the
// rule where nothing happened — its panics, its watch errors — so that
// the first panic or watch error is an increase an alert sees; but those
// whose label values are not known before the first event (notInAdvance).
// Every alert links to a runbook section of docs/seeing.md that exists.
func TestChartDashboardsAndAlerts(t *testing.T) {
	r := template(t, "--set", "grafana.enabled=true", "--set", "prometheusRule.enabled=true")
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	cm := r.get(t, "ConfigMap", "rel-syncloop-dashboard")
	if cm.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard ConfigMap lacks the sidecar's label: %v", cm.GetLabels())
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", "syncloop.json")
	if err := json.Unmarshal([]byte(data), &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	exprs := map[string]string{} // where → PromQL
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			exprs["panel "+p.Title+" #"+string(rune('A'+i))] = tg.Expr
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			m := labelValues.FindStringSubmatch(q["query"].(string))
			if m == nil {
				t.Errorf("variable %s: query %v is not label_values(SELECTOR, LABEL)", v.Name, q["query"])
				continue
			}
			exprs["variable "+v.Name] = m[1]
		}
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	pr := r.get(t, "PrometheusRule", "rel-syncloop")
	raw, _ := json.Marshal(pr.Object)
	if err := json.Unmarshal(raw, &rule); err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(filepath.Join("..", "..", "docs", "seeing.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rule.Spec.Groups {
		for _, a := range g.Rules {
			alerts++
			exprs["alert "+a.Alert] = a.Expr
			_, anchor, _ := strings.Cut(a.Annotations["runbook_url"], "#")
			if anchor == "" || !strings.Contains(string(docs), `<a id="`+anchor+`"></a>`) {
				t.Errorf("alert %s: runbook %q has no section in docs/seeing.md", a.Alert, a.Annotations["runbook_url"])
			}
			if a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
				t.Errorf("alert %s has no summary or description", a.Alert)
			}
		}
	}
	if alerts < 8 || len(exprs) < 40 {
		t.Fatalf("found %d alerts and %d expressions in all; the chart renders fewer than it should", alerts, len(exprs))
	}

	// Grafana's variables, as Grafana substitutes them.
	grafanaVars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*", "$rule", ".*", "${datasource}", "")
	named := map[string][]string{} // metric → where
	rated := map[string][]string{} // metric → where its rate or increase is taken
	for where, e := range exprs {
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(e))
		if err != nil {
			t.Errorf("%s: %v\n%s", where, err, e)
			continue
		}
		parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			named[vs.Name] = append(named[vs.Name], where)
			for _, p := range path {
				if c, ok := p.(*parser.Call); ok && slices.Contains([]string{"rate", "irate", "increase"}, c.Func.Name) {
					rated[vs.Name] = append(rated[vs.Name], where)
				}
			}
			return nil
		})
	}

	live, body := liveMetrics(t)
	registered := registeredMetrics(t)
	// What a syncloop that reconciled has at once: the dashboard's core.
	for _, m := range []string{"syncloop_reconcile_total", "syncloop_reconcile_duration_seconds_bucket", "syncloop_apply_total",
		"syncloop_rules_loaded", "syncloop_rule_ready", "workqueue_depth", "rest_client_requests_total", "process_resident_memory_bytes"} {
		if !live[m] {
			t.Errorf("%s is not on the live /metrics", m)
		}
		if len(named[m]) == 0 {
			t.Errorf("no panel or alert shows %s", m)
		}
	}
	for m, where := range named {
		base := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(m, "")
		if !live[m] && !registered[m] && !registered[base] {
			t.Errorf("%s, named by %v, is not a metric syncloop exports", m, where)
		}
	}
	if len(rated) < 10 {
		t.Fatalf("found the rate or increase of %d metrics; the chart takes more", len(rated))
	}
	for m, where := range rated {
		if _, ok := notInAdvance[m]; !ok && !live[m] {
			t.Errorf("%s, whose rate or increase %v take, has no series before its first event: the first is no increase", m, where)
		}
	}
	// The rule's panics by where and its watch errors by reason, at 0.
	for _, series := range []string{`syncloop_panics_total{rule="dashboards",where="reconcile"} 0`, `syncloop_panics_total{rule="dashboards",where="revisions"} 0`,
		`syncloop_panics_total{rule="",where="load"} 0`, `syncloop_watch_errors_total{reason="Forbidden",resource="namespaces"} 0`,
		`syncloop_watch_errors_total{reason="Unreachable",resource="configmaps"} 0`, `syncloop_apply_total{action="conflict",rule="dashboards"} 0`,
		`syncloop_reconcile_total{result="error",rule="dashboards"} 0`, `syncloop_rules_reload_total{result="error"} 0`} {
		if !strings.Contains(body, "\n"+series+"\n") {
			t.Errorf("/metrics lacks %s", series)
		}
	}
}

// notInAdvance are the counters the chart takes the rate or increase of
// whose series an event makes, and why.
var notInAdvance = map[string]string{
	"syncloop_drift_repairs_total":                "the field manager is known when a repair names it",
	"syncloop_crd_apply_total":                    "only a rule that defines a kind has them (made at 0 as it loads; internal/metrics TestKnownSeriesAtZero)",
	"syncloop_storage_migration_objects_total":    "only a storage migration has them, by CRD",
	"syncloop_conversions_total":                  "only the conversion webhook's answers have them, by kind and versions",
	"syncloop_conversion_duration_seconds_bucket": "only the conversion webhook's answers have them, by kind",
}

// liveMetrics are the metric names on the /metrics of a syncloop that has
// reconciled a trigger, and that /metrics.
func liveMetrics(t *testing.T) (names map[string]bool, body string) {
	t.Helper()
	env, cs, _ := clients(t)
	ns := newNamespace(t, cs, "dashboards")
	file := writeFile(t, t.TempDir(), "rule.yaml", namespaceRule("dashboards", ns))
	metricsAddr, _ := runInProcess(t, "-f", file, "--kubeconfig", env.Kubeconfig())
	names = map[string]bool{}
	reconciled := regexp.MustCompile(`\nsyncloop_reconcile_total\{result="success",rule="dashboards"\} [1-9]`)
	pollUntil(t, 60*time.Second, "a reconcile counted", func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		for _, line := range strings.Split(body, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			name, _, _ := strings.Cut(line, "{")
			name, _, _ = strings.Cut(name, " ")
			names[name] = true
		}
		return reconciled.MatchString(body)
	})
	_ = cs.CoreV1().Namespaces().Delete(t.Context(), ns, metav1.DeleteOptions{})
	return names, body
}

// registeredMetrics are the families syncloop registers, series or not.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	rec := &describer{names: map[string]bool{}}
	metrics.New(rec, func() int { return 0 }, func() []metrics.RuleReady { return nil }, metrics.Known{})
	metrics.NewConversions(rec, webhook.Refusals)
	metrics.NewRollouts(rec, func() []metrics.Rollout { return nil })
	metrics.NewShard(rec, func() map[string]int { return nil }, func() map[string]int { return nil })
	metrics.NewFleet(rec, func() int { return 0 }, func() int { return 0 }, func() map[string]bool { return nil })
	if len(rec.names) < 30 {
		t.Fatalf("syncloop registers %d metric families: %v", len(rec.names), slices.Sorted(func(yield func(string) bool) {
			for n := range rec.names {
				if !yield(n) {
					return
				}
			}
		}))
	}
	return rec.names
}

// describer is a Registerer that keeps the names of what is registered.
type describer struct{ names map[string]bool }

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := descName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describer) Unregister(prometheus.Collector) bool { return true }
