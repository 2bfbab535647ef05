// Package metrics exposes what syncloop counts as Prometheus metrics: the
// engine's reconciles and writes, the informers running, the rules loaded,
// and client-go's workqueue metrics per rule. Everything is registered on a
// registry the caller owns; nothing here is global.
//
// It knows the metric names docs/seeing.md's "Metrics" lists and nothing of
// how the engine works: the engine reports through its Metrics interface,
// which *Metrics implements.
package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"
)

// Metrics holds syncloop's collectors.
type Metrics struct {
	reconciles *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	writes     *prometheus.CounterVec
	rules      prometheus.Gauge
	reloads    *prometheus.CounterVec
	watchErrs  *prometheus.CounterVec
	crds       *prometheus.CounterVec
	panics     *prometheus.CounterVec
	repairs    *prometheus.CounterVec

	queue     queueMetrics
	functions functionMetrics

	api apiMetrics

	known  Known
	bounds labelBounds
}

// apiMetrics are syncloop's API requests and the server's pushback.
type apiMetrics struct {
	requests  *prometheus.CounterVec
	tooMany   prometheus.Counter
	throttled *prometheus.CounterVec
	limit     prometheus.Gauge
}

// newAPIMetrics makes the API request and pushback metrics; the
// throttling reasons are series at 0.
func newAPIMetrics() apiMetrics {
	a := apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_requests_total", Help: fmt.Sprintf("API requests by status code, method and host (past %d hosts, %s).", MaxHosts, Other),
		}, []string{"code", "method", "host"}),
		tooMany: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncloop_api_too_many_requests_total", Help: "API requests the server refused with 429 Too Many Requests (API Priority and Fairness); each is retried after its Retry-After.",
		}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_api_throttled_seconds_total", Help: "Time API requests spent waiting because the server pushed back, by reason: retry-after (the wait a 429 asked for) or limit (a free slot under the lowered concurrency limit).",
		}, []string{"reason"}),
		limit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncloop_api_concurrency_limit", Help: "Concurrent API requests allowed since the server last pushed back; 0 while there is no limit.",
		}),
	}
	for _, reason := range []string{"retry-after", "limit"} {
		a.throttled.WithLabelValues(reason)
	}
	return a
}

func (a apiMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{a.requests, a.tooMany, a.throttled, a.limit}
}

// labelBounds bound the labels whose values other parties name.
type labelBounds struct {
	managers, resources, reasons, hosts *bounded
}

// functionMetrics are the calls of functions.
type functionMetrics struct {
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// queueMetrics are client-go's workqueue metrics, one queue per rule.
type queueMetrics struct {
	depth      *prometheus.GaugeVec
	adds       *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	work       *prometheus.HistogramVec
	unfinished *prometheus.GaugeVec
	longest    *prometheus.GaugeVec
	retries    *prometheus.CounterVec
}

// New registers syncloop's metrics, and Go and process collectors, on reg.
// informers is read at every scrape for syncloop_informers, and rules —
// each rule in force and whether it runs — for syncloop_rule_ready.
// known are the label values whose series are made at 0 in advance.
func New(reg prometheus.Registerer, informers func() int, rules func() []RuleReady, known Known) *Metrics {
	m := &Metrics{
		known: known,
		bounds: labelBounds{
			managers:  newBounded(MaxManagers, wellKnownManagers...),
			resources: newBounded(MaxResources),
			reasons:   newBounded(MaxReasons, known.WatchReasons...),
			hosts:     newBounded(MaxHosts),
		},
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_reconcile_total", Help: "Reconciles by rule and result (success, error).",
		}, []string{"rule", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "syncloop_reconcile_duration_seconds", Help: "Time one reconcile took, by rule.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"rule"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_apply_total", Help: "Children and statuses by rule and action (create, update, adopt, unchanged, delete, status, wait, conflict).",
		}, []string{"rule", "action"}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncloop_rules_loaded", Help: "Rules in force.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_rules_reload_total", Help: "Loads of the rule files by result: success, or error when a file failed (its last good version stays in force).",
		}, []string{"result"}),
		crds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_crd_apply_total", Help: "Applies of the CustomResourceDefinitions of the kinds rules define, by rule and result: created, updated, or failed (retried with backoff; /readyz says why).",
		}, []string{"rule", "result"}),
		panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_panics_total", Help: "Panics contained, by rule and where (reconcile, handler, loop, rollout, load, crds, revisions): each failed its unit of work alone (a Failed Event, a file error, a halted rollout; the stack is in the log), never the process.",
		}, []string{"rule", "where"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_drift_repairs_total", Help: fmt.Sprintf("Repairs of children whose fields another field manager had changed, by rule and that manager (unknown when it could not be told; past the well-known ones and %d others per rule, %s). A child repaired 5 times in a minute is a fight: it is left alone for a cooling period (Contended).", MaxManagers, Other),
		}, []string{"rule", "manager"}),
		watchErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncloop_watch_errors_total", Help: fmt.Sprintf("Failed lists and watches of an informer by resource and reason (Forbidden: missing RBAC; Expired: etcd compacted, relisting; Unreachable: no answer; past %d resources and %d other reasons, %s). Each is retried with backoff.", MaxResources, MaxReasons, Other),
		}, []string{"resource", "reason"}),
		queue: newQueueMetrics(),
		functions: functionMetrics{
			calls: prometheus.NewCounterVec(prometheus.CounterOpts{
				Name: "syncloop_function_calls_total", Help: "Calls of functions by rule, resource (sync: the rule's function), transport (wasm, webhook) and result (success, error). A failed call fails its trigger, retried with backoff.",
			}, []string{"rule", "resource", "transport", "result"}),
			duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Name: "syncloop_function_call_duration_seconds", Help: "Time one function call took, by rule, resource and transport.",
				Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
			}, []string{"rule", "resource", "transport"}),
		},
		api: newAPIMetrics(),
	}
	reg.MustRegister(m.api.collectors()...)
	reg.MustRegister(m.reconciles, m.duration, m.writes, m.rules, m.reloads, m.watchErrs, m.crds, m.panics, m.repairs,
		m.functions.calls, m.functions.duration,
		m.queue.depth, m.queue.adds, m.queue.latency, m.queue.work, m.queue.unfinished, m.queue.longest, m.queue.retries,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "syncloop_informers", Help: "Shared informers running.",
		}, func() float64 { return float64(informers()) }),
		rulesReady{rules},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	for _, result := range []string{"success", "error"} {
		m.reloads.WithLabelValues(result)
	}
	for _, where := range known.UnruledPanics {
		m.panics.WithLabelValues("", where)
	}
	return m
}

// newQueueMetrics makes client-go's workqueue metrics, one series per rule.
func newQueueMetrics() queueMetrics {
	return queueMetrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_depth", Help: "Current depth of the workqueue.",
		}, []string{"name"}),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_adds_total", Help: "Adds handled by the workqueue.",
		}, []string{"name"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_queue_duration_seconds", Help: "How long an item stays in the workqueue before being requested.",
			Buckets: prometheus.ExponentialBuckets(10e-9, 10, 12),
		}, []string{"name"}),
		work: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_work_duration_seconds", Help: "How long processing an item from the workqueue takes.",
			Buckets: prometheus.ExponentialBuckets(10e-9, 10, 12),
		}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_unfinished_work_seconds", Help: "Seconds of work in progress not yet observed by work_duration.",
		}, []string{"name"}),
		longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_longest_running_processor_seconds", Help: "Seconds the longest running processor has been running.",
		}, []string{"name"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_retries_total", Help: "Retries handled by the workqueue.",
		}, []string{"name"}),
	}
}

// RuleReady is whether one rule runs, and the identity it acts as
// (namespace/name of its ServiceAccount; "" syncloop's own).
type RuleReady struct {
	Rule, Identity string
	Ready          bool
}

// rulesReady collects syncloop_rule_ready at scrape time, so a removed
// rule leaves no series behind.
type rulesReady struct{ rules func() []RuleReady }

var ruleReadyDesc = prometheus.NewDesc("syncloop_rule_ready",
	"1 when the rule runs; 0 while it waits for a kind the API server does not serve or for informers that cannot sync (see /readyz for why). identity is the ServiceAccount the rule acts as (none: syncloop's own).",
	[]string{"rule", "identity"}, nil)

func (r rulesReady) Describe(ch chan<- *prometheus.Desc) { ch <- ruleReadyDesc }

func (r rulesReady) Collect(ch chan<- prometheus.Metric) {
	for _, rr := range r.rules() {
		v := 0.0
		if rr.Ready {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(ruleReadyDesc, prometheus.GaugeValue, v, rr.Rule, rr.Identity)
	}
}

// ReconcileDone implements engine.Metrics.
func (m *Metrics) ReconcileDone(rule, result string, took time.Duration) {
	m.reconciles.WithLabelValues(rule, result).Inc()
	m.duration.WithLabelValues(rule).Observe(took.Seconds())
}

// Write implements engine.Metrics.
func (m *Metrics) Write(rule, action string) { m.writes.WithLabelValues(rule, action).Inc() }

// WatchError implements engine.Metrics. The resource and the reason
// (a remote API server's to give) are bounded: MaxResources,
// MaxReasons.
func (m *Metrics) WatchError(resource, reason string) {
	m.watchErrs.WithLabelValues(m.bounds.resources.value("", resource), m.bounds.reasons.value("", reason)).Inc()
}

// Watching implements engine.Metrics: resource's watch error series, one
// per reason known in advance, are made at 0.
func (m *Metrics) Watching(resource string) {
	resource = m.bounds.resources.value("", resource)
	for _, reason := range m.known.WatchReasons {
		m.watchErrs.WithLabelValues(resource, reason)
	}
}

// Panicked implements engine.Metrics; the manager counts the panics it
// contains (a rule file's load, the CRDs and revisions kept) through it
// too, with rule "" where no rule is known.
func (m *Metrics) Panicked(rule, where string) { m.panics.WithLabelValues(rule, where).Inc() }

// DriftRepaired implements engine.Metrics. The manager is bounded: the
// well-known ones, and MaxManagers others per rule.
func (m *Metrics) DriftRepaired(rule, manager string) {
	m.repairs.WithLabelValues(rule, m.bounds.managers.value(rule, manager)).Inc()
}

// FunctionCalled implements engine.Metrics.
func (m *Metrics) FunctionCalled(rule, resource, transport, result string, took time.Duration) {
	m.functions.calls.WithLabelValues(rule, resource, transport, result).Inc()
	m.functions.duration.WithLabelValues(rule, resource, transport).Observe(took.Seconds())
}

// RuleRemoved implements engine.Metrics: every series labelled with the
// rule, or with its workqueue's name, goes.
func (m *Metrics) RuleRemoved(rule string) {
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.reconciles, m.duration, m.writes, m.panics, m.repairs, m.crds, m.functions.calls, m.functions.duration} {
		v.DeletePartialMatch(prometheus.Labels{"rule": rule})
	}
	m.bounds.managers.forget(rule)
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.functions.calls, m.functions.duration,
		m.queue.depth, m.queue.adds, m.queue.latency, m.queue.work, m.queue.unfinished, m.queue.longest, m.queue.retries} {
		v.DeletePartialMatch(prometheus.Labels{"name": rule})
	}
}

// TooManyRequests implements dynamic.FlowMetrics.
func (m *Metrics) TooManyRequests() { m.api.tooMany.Inc() }

// Waited implements dynamic.FlowMetrics.
func (m *Metrics) Waited(reason string, d time.Duration) {
	m.api.throttled.WithLabelValues(reason).Add(d.Seconds())
}

// ConcurrencyLimit implements dynamic.FlowMetrics.
func (m *Metrics) ConcurrencyLimit(n int) { m.api.limit.Set(float64(n)) }

// CRDApplied counts one apply of the CRD of the kind rule defines:
// created, updated or failed.
func (m *Metrics) CRDApplied(rule, result string) { m.crds.WithLabelValues(rule, result).Inc() }

// RulesLoaded sets syncloop_rules_loaded.
func (m *Metrics) RulesLoaded(n int) { m.rules.Set(float64(n)) }

// Reloaded counts one load of the rule files; failed is true when a file
// had an error.
func (m *Metrics) Reloaded(failed bool) {
	result := "success"
	if failed {
		result = "error"
	}
	m.reloads.WithLabelValues(result).Inc()
}

// RESTClient returns the hook that counts client-go's API requests in
// rest_client_requests_total. client-go takes it process-wide, once:
// clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: m.RESTClient()}).
// The host (a kubeconfig Secret's server, for a cluster of the fleet) is
// bounded: MaxHosts.
func (m *Metrics) RESTClient() clientmetrics.ResultMetric {
	return restResult{m.api.requests, m.bounds.hosts}
}

type restResult struct {
	c     *prometheus.CounterVec
	hosts *bounded
}

func (r restResult) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, r.hosts.value("", host)).Inc()
}

// Workqueue returns client-go's workqueue metrics provider; queues are
// labelled by their name, the rule's.
func (m *Metrics) Workqueue() workqueue.MetricsProvider { return queueProvider{m} }

type queueProvider struct{ m *Metrics }

func (p queueProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.m.queue.depth.WithLabelValues(name)
}
func (p queueProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.m.queue.adds.WithLabelValues(name)
}
func (p queueProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.m.queue.latency.WithLabelValues(name)
}
func (p queueProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.m.queue.work.WithLabelValues(name)
}
func (p queueProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.queue.unfinished.WithLabelValues(name)
}
func (p queueProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.queue.longest.WithLabelValues(name)
}
func (p queueProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.m.queue.retries.WithLabelValues(name)
}

// Shard holds the metrics of a replica that shares the triggers with
// others (run --sharding).
type Shard struct {
	members   prometheus.Gauge
	handovers prometheus.Counter
	took      prometheus.Histogram
}

// NewShard registers the sharding metrics on reg. owned and cached are
// read at every scrape, for syncloop_shard_owned_keys (each rule's
// triggers this replica owns) and syncloop_shard_cached_objects (each
// rule's triggers and children in its caches).
func NewShard(reg prometheus.Registerer, owned, cached func() map[string]int) *Shard {
	s := &Shard{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncloop_shard_members", Help: "Members of the shard group in the view this replica works under (0 while it joins).",
		}),
		handovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncloop_shard_handovers_total", Help: "Membership changes this replica handed over for: it stopped the triggers it lost, waited for their reconciles, and published its new view.",
		}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "syncloop_shard_handover_duration_seconds", Help: "Time a handover took, from seeing the members change to publishing the new view (the reconciles of triggers lost included).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
	}
	reg.MustRegister(s.members, s.handovers, s.took, ruleGauge{ownedKeysDesc, owned}, ruleGauge{cachedObjectsDesc, cached})
	return s
}

// Members sets syncloop_shard_members.
func (s *Shard) Members(n int) { s.members.Set(float64(n)) }

// HandedOver counts one handover that took d.
func (s *Shard) HandedOver(d time.Duration) {
	s.handovers.Inc()
	s.took.Observe(d.Seconds())
}

// ruleGauge collects a gauge by rule at scrape time: desc, whose one
// label is the rule, with the values read then.
type ruleGauge struct {
	desc   *prometheus.Desc
	values func() map[string]int
}

func (g ruleGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g ruleGauge) Collect(ch chan<- prometheus.Metric) {
	for rule, n := range g.values() {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(n), rule)
	}
}

var ownedKeysDesc = prometheus.NewDesc("syncloop_shard_owned_keys",
	"Triggers of the rule this replica owns, by rendezvous hashing over the shard members.",
	[]string{"rule"}, nil)

// Rollout is one rule's rollout, as syncloop_rollout_* report it.
type Rollout struct {
	Rule, State string
	Step, Steps int
	// From and To name the revisions (short hashes); OnFrom and OnTo
	// count the triggers on each.
	From, To     string
	OnFrom, OnTo int
}

// RolloutStates are the states syncloop_rollout_state reports, one series
// each per rule.
var RolloutStates = []string{"Progressing", "Complete", "Halted", "RolledBack"}

// NewRollouts registers syncloop_rollout_state, _step, _steps and
// _triggers on reg, read from rollouts at every scrape.
func NewRollouts(reg prometheus.Registerer, rollouts func() []Rollout) {
	reg.MustRegister(rolloutCollector{rollouts})
}

type rolloutCollector struct{ rollouts func() []Rollout }

var (
	rolloutStateDesc = prometheus.NewDesc("syncloop_rollout_state",
		"1 for the state the rule's rollout is in (Progressing, Complete, Halted, RolledBack), 0 for the others; no series for a rule that has not changed since syncloop started.",
		[]string{"rule", "state"}, nil)
	rolloutStepDesc = prometheus.NewDesc("syncloop_rollout_step",
		"The step the rule's rollout has reached (1 is the first).", []string{"rule"}, nil)
	rolloutStepsDesc = prometheus.NewDesc("syncloop_rollout_steps",
		"The steps the rule's rollout takes in all, as far as its triggers say.", []string{"rule"}, nil)
	rolloutTriggersDesc = prometheus.NewDesc("syncloop_rollout_triggers",
		"Triggers of the rule on each revision of its rollout (the revision's hash, first 10 digits; role from or to).", []string{"rule", "revision", "role"}, nil)
)

func (c rolloutCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rolloutStateDesc
	ch <- rolloutStepDesc
	ch <- rolloutStepsDesc
	ch <- rolloutTriggersDesc
}

func (c rolloutCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range c.rollouts() {
		for _, s := range RolloutStates {
			v := 0.0
			if s == r.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(rolloutStateDesc, prometheus.GaugeValue, v, r.Rule, s)
		}
		ch <- prometheus.MustNewConstMetric(rolloutStepDesc, prometheus.GaugeValue, float64(r.Step), r.Rule)
		ch <- prometheus.MustNewConstMetric(rolloutStepsDesc, prometheus.GaugeValue, float64(r.Steps), r.Rule)
		ch <- prometheus.MustNewConstMetric(rolloutTriggersDesc, prometheus.GaugeValue, float64(r.OnFrom), r.Rule, r.From, "from")
		ch <- prometheus.MustNewConstMetric(rolloutTriggersDesc, prometheus.GaugeValue, float64(r.OnTo), r.Rule, r.To, "to")
	}
}

var cachedObjectsDesc = prometheus.NewDesc("syncloop_shard_cached_objects",
	"Triggers and children of the rule in this replica's caches: its share of the triggers and their children (every one while it judges a rollout of the rule).",
	[]string{"rule"}, nil)
