package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/reload"
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
	// MetricsAddr and ProbeAddr are the addresses of /metrics and of
	// /healthz and /readyz; "" or "0" turns each off.
	MetricsAddr, ProbeAddr string
	// DrainTimeout bounds how long in-flight reconciles may take on
	// shutdown (and on handing triggers over) before their requests are
	// cancelled.
	DrainTimeout time.Duration
	// Events says which Events are emitted on triggers.
	Events engine.EventMode
	// DryRun prints the plan of every write (text, or JSON lines with
	// PlanJSON) to Stdout, and diagnostics to Stderr, instead of writing.
	DryRun   bool
	PlanJSON bool
	Stdout   io.Writer
	Stderr   io.Writer
	// Mode runs the engine: Single (nil), LeaderElection or Sharding.
	Mode Mode
}

// A Mode runs the engine the way one replica of an installation does.
// Single, LeaderElection and Sharding are the modes.
type Mode interface {
	// configure adjusts the engine's options before the engine is made.
	configure(p *process, o *engine.Options) error
	// run runs the engine (p.runEngine) as the mode allows until ctx ends,
	// and returns once it has stopped.
	run(ctx context.Context, p *process) error
	// status is the mode's part of /readyz.
	status() modeStatus
}

// modeStatus is what a mode says in /readyz.
type modeStatus struct {
	line    string // shown first; "" none
	standby bool   // the engine does not run here: ready without it
	ready   bool   // false: not ready, whatever the engine says
}

// process is one running syncloop: what the modes and probes reach.
type process struct {
	opts    Options
	logger  klog.Logger
	clients *Clients
	metrics *metrics.Metrics
	reg     *prometheus.Registry
	engine  *engine.Engine
	files   *fileErrors
	current *currentSet
	updates chan *rules.Set // the newest set not yet applied by the engine
}

// runEngine runs the engine on the rules in force, and on each new set,
// until ctx ends.
func (p *process) runEngine(ctx context.Context) {
	if err := p.engine.Run(ctx, p.current.get(), p.updates); err != nil {
		p.logger.Error(err, "Engine stopped")
	}
}

// Run runs syncloop until ctx ends: then it stops taking work, lets
// in-flight reconciles finish, stops its informers and returns nil. It
// returns an error when it cannot start.
func Run(ctx context.Context, o Options) error {
	if o.Mode == nil {
		o.Mode = Single{}
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	setGCPercent()
	loader, err := rules.NewLoader(expr.Options{CostLimit: o.CostLimit})
	if err != nil {
		return err
	}
	if err := loader.SetInstallation(o.Installation); err != nil {
		return err
	}
	p := &process{opts: o, files: &fileErrors{}, current: &currentSet{}, updates: make(chan *rules.Set, 1)}
	p.reg = prometheus.NewRegistry()
	p.metrics = metrics.New(p.reg, func() int { return p.engine.Informers() }, func() map[string]bool {
		ready := map[string]bool{}
		for _, s := range p.engine.States() {
			ready[s.Rule] = s.State == engine.StateRunning
		}
		return ready
	})
	if p.clients, err = NewClients(o.Config, p.metrics); err != nil {
		return err
	}
	p.logger = klog.FromContext(ctx)
	ctx = klog.NewContext(ctx, p.logger)
	logger := p.logger

	// The rules in force: every file that loads; a broken file is reported
	// and, while syncloop runs, keeps its last good version. Rules are typed
	// by the cluster's schemas and checked again when a CRD of a group they
	// use changes.
	openAPI, served, mapper := p.clients.OpenAPI, p.clients.Schemas, p.clients.Mapper
	loader.UseSchemas(served)
	loader.UseScopes(mapper)
	src := reload.NewSource(loader, o.Rules)
	watcher := reload.NewWatcher(src, 0)
	// published waits, up to timeout, until the API server publishes
	// group's schemas anew: it does so a moment after a CRD changes.
	published := func(group string, timeout time.Duration) bool {
		return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
			tags, err := openAPI.Tags(group)
			return err == nil && served.Stale(group, tags), nil
		}) == nil
	}
	recheck := func(group string) {
		go func() {
			published(group, 30*time.Second)
			served.Forget(group)
			logger.Info("CustomResourceDefinition changed: checking the rules that use it again", "group", group)
			watcher.Recheck()
		}()
	}
	var installed sync.Map // groups of the CRDs there at start
	dynamic.WatchCRDs(ctx, p.clients.Metadata, 5*time.Second, func(group string, initial bool) {
		switch set := p.current.get(); {
		case initial:
			installed.Store(group, true)
		case set != nil && usesGroup(set, group):
			recheck(group)
		default:
			served.Forget(group)
		}
	})
	loaded := src.Load()
	// A CRD created just before syncloop started may not have its schema
	// published yet. The rules that use it are loaded again once it is —
	// before anything starts, so that they start once, typed, instead of
	// restarting (and reporting not ready) a moment after start. Should it
	// take longer, they start untyped and are checked again when it comes.
	var unpublished []string
	installed.Range(func(group, _ any) bool {
		if usesGroup(loaded.Set, group.(string)) && served.Missing(group.(string)) {
			unpublished = append(unpublished, group.(string))
		}
		return true
	})
	if len(unpublished) > 0 {
		deadline := time.Now().Add(startSchemaWait)
		for _, group := range unpublished {
			if !published(group, time.Until(deadline)) {
				recheck(group)
				continue
			}
			served.Forget(group)
		}
		src.Invalidate()
		loaded = src.Load()
	}
	p.files.report(logger, loaded.Errors)
	logWarnings(logger, loaded.Set)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.clients.Core.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	p.metrics.RulesLoaded(loaded.Set.Len())
	p.metrics.Reloaded(len(loaded.Errors) > 0)
	restRequests.Store(p.metrics)
	eo := engine.Options{
		Client:       p.clients.Dynamic,
		Mapper:       mapper,
		Recorder:     broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "syncloop"}),
		Metrics:      p.metrics,
		QueueMetrics: p.metrics.Workqueue(),
		DrainTimeout: o.DrainTimeout,
		Namespace:    o.Namespace,
		Events:       o.Events,
	}
	if o.DryRun {
		eo.Plan = engine.NewPlanPrinter(o.Stdout, o.Stderr, o.PlanJSON, true)
		logger.Info("Dry run: every write is a server-side dry run, printed as a plan; nothing is persisted")
	}
	if err := o.Mode.configure(p, &eo); err != nil {
		return err
	}
	p.engine = engine.New(eo)

	if o.MetricsAddr != "" && o.MetricsAddr != "0" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{Registry: p.reg}))
		srv, err := serve(ctx, o.MetricsAddr, "metrics", mux)
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	if o.ProbeAddr != "" && o.ProbeAddr != "0" {
		srv, err := serve(ctx, o.ProbeAddr, "health probes", probes(p.engine, p.files, o.Mode))
		if err != nil {
			return err
		}
		defer srv.Close()
	}
	// Hot reload: the newest set waits in updates for the engine; a standby
	// keeps the set current for when it starts leading.
	p.current.put(loaded.Set)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		err := watcher.Run(ctx, func(st reload.Status) {
			p.files.report(logger, st.Errors)
			logWarnings(logger, st.Set)
			p.metrics.Reloaded(len(st.Errors) > 0)
			p.metrics.RulesLoaded(st.Set.Len())
			logger.Info("Rule files reloaded", "rules", st.Set.Len(), "fileErrors", len(st.Errors))
			p.current.put(st.Set)
			select {
			case <-p.updates: // superseded
			default:
			}
			p.updates <- st.Set
		})
		if err != nil {
			logger.Error(err, "Rule files are no longer watched: changes need a restart")
		}
	}()

	logger.Info("Starting", "rules", loaded.Set.Len(), "host", p.clients.Config.Host, "installation", o.Installation)
	err = o.Mode.run(ctx, p)
	<-watchDone
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

// GCPercent is the garbage collector's target for Run unless GOGC is set:
// syncloop's heap is mostly its informer caches, which live as long as the
// process, while what it allocates per request dies at once. Go's default
// (100) lets the heap grow to twice the caches before collecting; 50 keeps
// it at one and a half — measured with 5,000 triggers and 5,000 children:
// 82–84 MiB resident instead of 95–96, for 3–8 % more CPU.
const GCPercent = 50

func setGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(GCPercent)
	}
}

// currentSet is the newest rule set, shared by the reload watcher and the
// engine's start.
type currentSet struct {
	mu  sync.Mutex
	set *rules.Set
}

func (c *currentSet) put(s *rules.Set) { c.mu.Lock(); c.set = s; c.mu.Unlock() }

func (c *currentSet) get() *rules.Set { c.mu.Lock(); defer c.mu.Unlock(); return c.set }

// serve serves h on addr until the returned server is closed.
func serve(ctx context.Context, addr, what string, h http.Handler) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Server failed", "server", what)
		}
	}()
	return srv, nil
}

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
