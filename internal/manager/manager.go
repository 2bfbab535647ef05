package manager

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"net/http/pprof"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/internal/webhook"
	"github.com/syncloop/syncloop/rules"
)

// Options say what a running syncloop does; package main fills them from
// its flags.
type Options struct {
	// Config reaches the API server. Run changes it (flow control).
	Config *rest.Config
	// Rules are the rule files and directories, watched for changes.
	Rules []string
	// CostLimit is the CEL cost limit of one evaluation.
	CostLimit uint64
	// Installation names this installation of syncloop
	// (rules.Loader.SetInstallation); "": the default one.
	Installation string
	// Namespace, when set, limits syncloop to one namespace
	// (engine.Options.Namespace).
	Namespace string
	// Serve are the addresses syncloop listens on.
	Serve Addresses
	// DrainTimeout bounds how long in-flight reconciles may take on
	// shutdown (and on handing triggers over) before their requests are
	// cancelled.
	DrainTimeout time.Duration
	// Events says which Events are emitted on triggers: "warnings" (or
	// "") or "all".
	Events string
	// DryRun, when set, prints the plan of every write instead of writing.
	DryRun *DryRun
	// Mode runs the engine: Single (nil), LeaderElection or Sharding.
	Mode Mode
	// SyncloopNamespace is where syncloop keeps its own objects: the
	// revisions of its rules ("" : default).
	SyncloopNamespace string
	// RulesConfigMap, NAMESPACE/NAME (or NAME in SyncloopNamespace), is
	// the ConfigMap the rule files are mounted from: why a file did not
	// load becomes a Warning Event on it. "": none.
	RulesConfigMap string
	// CRDs say how the CRDs of the kinds rules define are kept.
	CRDs CRDs
	// Identities say who rules act as, and whose rules are read.
	Identities Identities
	// Clusters say where the cluster inventory's kubeconfig Secrets are
	// and what they may do.
	Clusters Clusters
}

// Clusters say where the kubeconfig Secrets of the cluster inventory are
// and what a kubeconfig there may do beyond inline credentials.
type Clusters struct {
	// Namespace holds the kubeconfig Secrets ("": SyncloopNamespace).
	Namespace string
	// Trust is what they may do besides inline credentials (the
	// --insecure-kubeconfig-* flags): nothing by default.
	Trust fleet.Trust
	// RequestTimeout bounds each request to a cluster but a watch
	// (--cluster-request-timeout; 0: dynamic.DefaultRemoteTimeout).
	RequestTimeout time.Duration
}

// Identities say who rules act as, and whether the tenants' rules are
// read.
type Identities struct {
	// Default is the identity of every rule that names none
	// (rules.Loader.SetIdentities); zero: syncloop's own.
	Default rules.ServiceAccount
	// Tenants also reads rules from the ConfigMaps labelled
	// syncloop.dev/rules: "true" in every namespace (or Namespace's): each
	// key a file of the tenant rules of its namespace
	// (rules.Loader.ForTenant), reloaded when they change; why one does
	// not load is a Warning Event on its ConfigMap.
	Tenants bool
}

// CRDs say how the CRDs of the kinds rules define are kept, and how the
// API server reaches syncloop to convert their objects between versions.
type CRDs struct {
	// NoManage (--manage-crds=false) leaves the CRDs to others (GitOps):
	// syncloop only checks that the served ones are those the rules
	// generate.
	NoManage bool
	// Webhook is where the API server reaches the conversion webhook
	// (rules.Loader.SetConversionWebhook).
	Webhook rules.ConversionWebhook
	// Secret is the Secret in SyncloopNamespace that holds the webhook's
	// CA and serving certificate (default syncloop-webhook-tls).
	Secret string
	// CertManager, NAMESPACE/NAME, is the cert-manager Certificate that
	// issues the webhook's certificate into Secret, whose CA its injector
	// keeps in the CRDs; "": syncloop's own CA and certificate.
	CertManager string
	// ClientCA is a PEM file of the CAs whose client certificate the
	// webhook requires of its callers (webhook.ServerTLS); "": none.
	ClientCA string
	// MigrationQPS paces storage migrations: objects rewritten per second
	// (default DefaultMigrationQPS).
	MigrationQPS float64
}

// Addresses are where syncloop serves; "" or "0" turns each off.
type Addresses struct {
	// Metrics serves /metrics; Probes /healthz and /readyz.
	Metrics, Probes string
	// Pprof serves /debug/pprof/, Go's profiler; off by default, and
	// never beside /metrics: a profile costs CPU, and its address is
	// opened on purpose.
	Pprof string
	// Webhook serves the conversion webhook (/convert), over TLS.
	Webhook string
}

// DryRun is where a dry run prints: the plan of every write (text, or
// JSON lines) to Stdout, diagnostics to Stderr (nil: discarded).
type DryRun struct {
	JSON           bool
	Stdout, Stderr io.Writer
}

// process is one running syncloop, built whole by newProcess before
// anything runs, then started in order by start.
type process struct {
	opts    Options
	clients *Clients
	metrics *metrics.Metrics
	reg     *prometheus.Registry
	engine  *engine.Engine
	events  record.EventBroadcaster
	servers []*server // /metrics and the probes: listening, not serving yet
	rules   *ruleFiles
	fleet   *fleet.Inventory
}

// Run runs syncloop until ctx ends: then it stops taking work, lets
// in-flight reconciles finish, stops its informers and returns nil. It
// returns an error when it cannot start.
func Run(ctx context.Context, o Options) error {
	p, err := newProcess(ctx, o)
	if err != nil {
		return err
	}
	return p.start(klog.NewContext(ctx, klog.FromContext(ctx)))
}

// known are the label values syncloop's metrics make series of at 0 in
// advance: the engine's, and the manager's own.
func known() metrics.Known {
	return metrics.Known{
		Results:       engine.ReconcileResults,
		Writes:        engine.WriteActions,
		Panics:        append(slices.Clone(engine.PanicWheres), panicCRDs, panicRevisions),
		CRDResults:    []string{crdCreated, crdUpdated, crdFailed},
		UnruledPanics: []string{panicLoad, panicModules},
		WatchReasons:  engine.WatchReasons,
	}
}

// newProcess builds every piece of a running syncloop — clients, metrics,
// the rule files and their loader, Events, the mode, the engine, the
// servers' listeners — and starts none: an error here means nothing ran.
func newProcess(ctx context.Context, o Options) (*process, error) {
	if o.Mode == nil {
		o.Mode = Single{}
	}
	events, err := engine.ParseEventMode(o.Events)
	if err != nil {
		return nil, err
	}
	if o.SyncloopNamespace == "" {
		o.SyncloopNamespace = "default"
	}
	p := &process{opts: o, reg: prometheus.NewRegistry()}
	p.metrics = metrics.New(p.reg, func() int { return p.engine.Informers() }, func() []metrics.RuleReady {
		var out []metrics.RuleReady
		for _, s := range p.engine.States() {
			out = append(out, metrics.RuleReady{Rule: s.Rule, Identity: s.Identity, Ready: s.State == engine.StateRunning})
		}
		return out
	}, known())
	if p.clients, err = NewClients(o.Config, p.metrics); err != nil {
		return nil, err
	}
	if p.rules, err = newRuleFiles(klog.FromContext(ctx), o, p.clients, p.metrics); err != nil {
		return nil, err
	}
	p.events = record.NewBroadcaster(record.WithContext(ctx))
	recorder := p.events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "syncloop"})
	cm, err := parseConfigMap(o.RulesConfigMap, o.SyncloopNamespace)
	if err != nil {
		p.events.Shutdown()
		return nil, err
	}
	p.rules.announcer = &announcer{configMap: cm, core: p.clients.Core, recorder: recorder}
	conv := metrics.NewConversions(p.reg, webhook.Refusals)
	if p.rules.conversions, err = newConversions(o, p.clients, conv, serves(o.Serve.Webhook)); err != nil {
		p.events.Shutdown()
		return nil, err
	}
	p.rules.crds.caBundle, p.rules.crds.injectCA = p.rules.conversions.caBundle(), o.CRDs.CertManager
	if o.DryRun == nil {
		p.rules.crds.migrations = &migrations{client: p.clients.Dynamic, crds: p.rules.crds.crds, qps: cmp.Or(o.CRDs.MigrationQPS, DefaultMigrationQPS),
			active: p.rules.active.Load, count: conv.Migrated, running: conv.Migrating}
	}
	p.rules.revisions.recorder = recorder
	if p.rules.tenants != nil {
		p.rules.tenants.recorder = recorder
	}
	p.fleet = newInventory(p.clients, o.Clusters, o.SyncloopNamespace, recorder, fleetMetrics(p))
	eo := engine.Options{
		Fleet:        p.fleet,
		Client:       p.clients.Dynamic,
		Mapper:       p.clients.Mapper,
		Recorder:     recorder,
		Metrics:      p.metrics,
		QueueMetrics: p.metrics.Workqueue(),
		DrainTimeout: o.DrainTimeout,
		Namespace:    o.Namespace,
		Events:       events,
	}
	if d := o.DryRun; d != nil {
		eo.Plan = engine.NewPlanPrinter(cmp.Or[io.Writer](d.Stdout, io.Discard), cmp.Or[io.Writer](d.Stderr, io.Discard), d.JSON, true)
		p.rules.crds.dryRun = eo.Plan
	} else {
		eo.Rollouts = p.rules.revisions
	}
	if err := o.Mode.configure(&eo); err != nil {
		p.events.Shutdown()
		return nil, err
	}
	p.engine = engine.New(eo)
	rolloutMetrics(p)
	if err := p.listen(); err != nil {
		p.events.Shutdown()
		return nil, err
	}
	return p, nil
}

// rolloutMetrics registers the metrics of the engine's rollouts.
func rolloutMetrics(p *process) {
	metrics.NewRollouts(p.reg, func() []metrics.Rollout {
		var out []metrics.Rollout
		for _, r := range p.engine.Rollouts() {
			out = append(out, metrics.Rollout{Rule: r.Rule, State: r.State, Step: r.Step, Steps: r.Steps,
				From: shortHash(r.From), To: shortHash(r.To), OnFrom: r.OnFrom, OnTo: r.OnTo})
		}
		return out
	})
}

// listen opens the listeners of /metrics, the probes and the profiler (""
// or "0": off).
func (p *process) listen() error {
	o := p.opts
	if serves(o.Serve.Metrics) {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{Registry: p.reg}))
		srv, err := listen(o.Serve.Metrics, "metrics", mux, metricsLimits)
		if err != nil {
			return err
		}
		p.servers = append(p.servers, srv)
	}
	if serves(o.Serve.Probes) {
		srv, err := listen(o.Serve.Probes, "health probes", probes(p.engine, p.rules.files, p.rules.crds, p.rules.revisions, p.rules.conversions, o.Mode,
			func() []string { return clusterLines(p.fleet) }), probeLimits)
		if err != nil {
			p.closeServers()
			return err
		}
		p.servers = append(p.servers, srv)
	}
	if serves(o.Serve.Webhook) {
		srv, err := p.rules.conversions.listen(o.Serve.Webhook)
		if err != nil {
			p.closeServers()
			return err
		}
		p.servers = append(p.servers, srv)
	}
	if serves(o.Serve.Pprof) {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		srv, err := listen(o.Serve.Pprof, "profiler", mux, pprofLimits)
		if err != nil {
			p.closeServers()
			return err
		}
		p.servers = append(p.servers, srv)
	}
	return nil
}

func (p *process) closeServers() {
	for _, s := range p.servers {
		s.Close()
	}
}

// start runs the process until ctx ends, starting its pieces in order:
// Events and the servers; the CRD watch, which the first load of the rule
// files waits on (schemas of CRDs just created); the rule files' watcher,
// and the release of the modules no rule in force calls; then the mode,
// which runs the engine. Each stops after those started after it.
func (p *process) start(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.clients.Core.CoreV1().Events("")})
	defer p.events.Shutdown()
	for _, s := range p.servers {
		s.serve(ctx)
	}
	defer p.closeServers()
	restRequests.Store(p.metrics)
	if p.opts.DryRun != nil {
		logger.Info("Dry run: every write is a server-side dry run, printed as a plan; nothing is persisted")
	}

	runInventory(ctx, p.fleet)
	set := p.rules.load(ctx)
	watched := p.rules.watch(ctx)
	released := p.rules.releaseModules(ctx, p.engine.InForce)
	logger.Info("Starting", "rules", set.Len(), "host", p.clients.Config.Host, "installation", p.opts.Installation)
	err := p.opts.Mode.run(ctx, &runner{
		engine: func(ctx context.Context) {
			// Only a replica that runs the rules keeps their CRDs: a
			// standby (perhaps of an older version, mid-upgrade) never
			// writes them.
			p.rules.working(ctx, true)
			defer p.rules.working(ctx, false)
			if err := p.engine.Run(ctx, p.rules.current.get(), p.rules.updates); err != nil {
				logger.Error(err, "Engine stopped")
			}
		},
		shards: p.engine,
		core:   p.clients.Core,
		reg:    p.reg,
	})
	<-watched
	<-released
	if err != nil {
		return err
	}
	logger.Info("Stopped")
	return nil
}

// startSchemaWait bounds how long the start waits for the schemas of CRDs
// created just before it (the API server publishes them within a second or
// two).
const startSchemaWait = 10 * time.Second

// currentSet is the newest rule set, shared by the reload watcher and the
// engine's start.
type currentSet struct {
	mu  sync.Mutex
	set *rules.Set
}

func (c *currentSet) put(s *rules.Set) { c.mu.Lock(); c.set = s; c.mu.Unlock() }

func (c *currentSet) get() *rules.Set { c.mu.Lock(); defer c.mu.Unlock(); return c.set }

// usesGroup reports whether a rule of set reads or writes a kind of group.
func usesGroup(set *rules.Set, group string) bool {
	for _, r := range set.Rules() {
		if slices.Contains(r.Groups(), group) {
			return true
		}
	}
	return false
}

// logWarnings logs what the rules in force may get wrong without being
// invalid (required fields a template lacks), and at -v=2 the kinds they
// touch that have no schema.
func logWarnings(logger klog.Logger, set *rules.Set) {
	for _, f := range set.Files() {
		for _, w := range f.Warnings {
			logger.Info("Rule warning", "warning", w.Error())
		}
		for _, n := range f.Notes {
			logger.V(2).Info("Rule note", "note", n.Error())
		}
	}
}

// shortHash is a revision's hash as its object is named: 10 digits.
func shortHash(h string) string { return h[:min(10, len(h))] }
