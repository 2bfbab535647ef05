package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/reload"
	"github.com/syncloop/syncloop/rules/schema"
)

// restRequests forwards client-go's API request counts to the running
// command's metrics. client-go takes this hook process-wide and once, so it
// is registered before any client exists (init) and pointed at each run's
// registry; a package-level value because client-go's hook is one.
var restRequests restForwarder

func init() {
	clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: &restRequests})
}

type restForwarder struct {
	m atomic.Pointer[metrics.Metrics]
}

func (f *restForwarder) Store(m *metrics.Metrics) { f.m.Store(m) }

func (f *restForwarder) Increment(ctx context.Context, code, method, host string) {
	if m := f.m.Load(); m != nil {
		m.RESTClient().Increment(ctx, code, method, host)
	}
}

// clients are the API clients a cluster command needs.
type clients struct {
	cfg       *rest.Config
	dynamic   *dynamic.Client
	discovery discovery.DiscoveryInterface
	core      kubernetes.Interface
	metadata  metadata.Interface
}

// clients makes the API clients; every request of all of them passes one
// FlowControl, which reports to fm (nil: nowhere).
func (f *clusterFlags) clients(fm dynamic.FlowMetrics) (*clients, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the client configuration: %w", err)
	}
	cfg.Wrap(dynamic.NewFlowControl(fm).Wrap)
	c := &clients{cfg: cfg}
	if c.dynamic, err = dynamic.NewClient(cfg); err != nil {
		return nil, err
	}
	if c.discovery, err = discovery.NewDiscoveryClientForConfig(cfg); err != nil {
		return nil, err
	}
	if c.core, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.metadata, err = metadata.NewForConfig(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// clusterFlags are the flags of every command that talks to a cluster.
type clusterFlags struct {
	kubeconfig     string
	context        string
	qps            float32
	burst          int
	watchNamespace string
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	cmd.Flags().StringVar(&f.context, "context", "", "kubeconfig context to use")
	cmd.Flags().Float32Var(&f.qps, "qps", 0, "cap on API requests per second, client-side (default 0: no cap; syncloop adapts to the API server's flow control)")
	cmd.Flags().IntVar(&f.burst, "burst", 0, "with --qps, the burst of API requests allowed over the cap (default 0: twice --qps)")
	cmd.Flags().StringVar(&f.watchNamespace, "watch-namespace", "", "limit syncloop to this namespace, so that it needs no cluster-wide rights: rules must watch and make namespaced kinds there")
}

// restConfig loads the client configuration the way kubectl does.
func (f *clusterFlags) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = clientRate(f.qps, f.burst)
	cfg.UserAgent = "syncloop/" + versionOrDev()
	return cfg, nil
}

// clientRate turns --qps and --burst into rest.Config's QPS and Burst: no
// client-side token bucket unless --qps is set (client-go reads QPS 0 as 5
// per second; a negative QPS turns its limiter off).
func clientRate(qps float32, burst int) (float32, int) {
	if qps <= 0 {
		return -1, 0
	}
	if burst <= 0 {
		burst = max(1, int(2*qps))
	}
	return qps, burst
}

// namespace is the kubeconfig context's namespace, the pod's namespace
// in-cluster, or "default".
func (f *clusterFlags) namespace() string {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: f.context}).Namespace()
	if err != nil || ns == "" {
		return "default"
	}
	return ns
}

func newRunCommand() *cobra.Command {
	var (
		rf          ruleFlags
		cf          clusterFlags
		probeAddr   string
		metricsAddr string
		drainPeriod time.Duration
		dryRun      bool
		output      string
		events      string
		lf          leaderFlags
	)
	cmd := &cobra.Command{
		Use:   "run -f PATH...",
		Short: "Run the controller: reconcile every rule against the cluster until stopped",
		Long: `run loads the rules and reconciles them until SIGTERM or SIGINT: it then stops
taking work, lets in-flight reconciles finish, stops its informers and exits 0.

The rule files are watched: a change is loaded within a second, and only the
rules that changed are restarted. A file with an error is reported (log,
syncloop_rules_reload_total{result="error"}, /readyz) and keeps its last good
version in force; at start, files that fail are left out and reported.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output must be text or json, not %q", output)
			}
			eventMode, err := engine.ParseEventMode(events)
			if err != nil {
				return fmt.Errorf("--%w", err)
			}
			setGCPercent()
			loader, err := rules.NewLoader(expr.Options{CostLimit: rf.costLimit})
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			var eng *engine.Engine
			m := metrics.New(reg, func() int { return eng.Informers() }, func() map[string]bool {
				ready := map[string]bool{}
				for _, s := range eng.States() {
					ready[s.Rule] = s.State == engine.StateRunning
				}
				return ready
			})
			cl, err := cf.clients(m)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger := klog.FromContext(ctx)
			ctx = klog.NewContext(ctx, logger)

			// The rules in force: every file that loads; a broken file is
			// reported and, while syncloop runs, keeps its last good version.
			// Rules are typed by the cluster's schemas and checked again
			// when a CRD of a group they use changes.
			openAPI := dynamic.NewOpenAPI(cl.discovery)
			served := schema.NewServed(openAPI.Document, schema.Builtin())
			loader.UseSchemas(served)
			src := reload.NewSource(loader, rf.paths)
			watcher := reload.NewWatcher(src, 0)
			current := &currentSet{}
			recheck := func(group string) {
				// The API server publishes a changed CRD's schema a moment
				// after the change: wait for it, then check again.
				go func() {
					_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
						tags, err := openAPI.Tags(group)
						return err == nil && served.Stale(group, tags), nil
					})
					served.Forget(group)
					logger.Info("CustomResourceDefinition changed: checking the rules that use it again", "group", group)
					watcher.Recheck()
				}()
			}
			var installed sync.Map // groups of the CRDs there at start
			dynamic.WatchCRDs(ctx, cl.metadata, 5*time.Second, func(group string, initial bool) {
				switch set := current.get(); {
				case initial:
					installed.Store(group, true)
				case set != nil && usesGroup(set, group):
					recheck(group)
				default:
					served.Forget(group)
				}
			})
			loaded := src.Load()
			// A CRD created just before syncloop started may not have its
			// schema published yet.
			installed.Range(func(group, _ any) bool {
				if usesGroup(loaded.Set, group.(string)) && served.Missing(group.(string)) {
					recheck(group.(string))
				}
				return true
			})
			files := &fileErrors{}
			files.report(logger, loaded.Errors)
			logWarnings(logger, loaded.Set)

			broadcaster := record.NewBroadcaster(record.WithContext(ctx))
			broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cl.core.CoreV1().Events("")})
			defer broadcaster.Shutdown()
			m.RulesLoaded(loaded.Set.Len())
			m.Reloaded(len(loaded.Errors) > 0)
			restRequests.Store(m)
			opts := engine.Options{
				Client:       cl.dynamic,
				Mapper:       dynamic.NewMapper(cl.discovery, 0),
				Recorder:     broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "syncloop"}),
				Metrics:      m,
				QueueMetrics: m.Workqueue(),
				DrainTimeout: drainPeriod,
				Namespace:    cf.watchNamespace,
				Events:       eventMode,
			}
			if dryRun {
				opts.Plan = engine.NewPlanPrinter(cmd.OutOrStdout(), cmd.ErrOrStderr(), output == "json", true)
				logger.Info("Dry run: every write is a server-side dry run, printed as a plan; nothing is persisted")
			}
			eng = engine.New(opts)

			if metricsAddr != "" && metricsAddr != "0" {
				mux := http.NewServeMux()
				mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
				srv, err := serve(ctx, metricsAddr, "metrics", mux)
				if err != nil {
					return err
				}
				defer srv.Close()
			}
			var ld *leader
			if lf.enabled {
				ld = &leader{done: make(chan struct{})}
			}
			if probeAddr != "" && probeAddr != "0" {
				srv, err := serve(ctx, probeAddr, "health probes", probes(eng, files, ld))
				if err != nil {
					return err
				}
				defer srv.Close()
			}
			// Hot reload: the newest set waits in updates for the engine; a
			// standby keeps the set current for when it starts leading.
			current.put(loaded.Set)
			updates := make(chan *rules.Set, 1)
			watchDone := make(chan struct{})
			go func() {
				defer close(watchDone)
				err := watcher.Run(ctx, func(st reload.Status) {
					files.report(logger, st.Errors)
					logWarnings(logger, st.Set)
					m.Reloaded(len(st.Errors) > 0)
					m.RulesLoaded(st.Set.Len())
					logger.Info("Rule files reloaded", "rules", st.Set.Len(), "fileErrors", len(st.Errors))
					current.put(st.Set)
					select {
					case <-updates: // superseded
					default:
					}
					updates <- st.Set
				})
				if err != nil {
					logger.Error(err, "Rule files are no longer watched: changes need a restart")
				}
			}()

			logger.Info("Starting", "rules", loaded.Set.Len(), "host", cl.cfg.Host)
			runEngine := func(ctx context.Context) {
				if err := eng.Run(ctx, current.get(), updates); err != nil {
					logger.Error(err, "Engine stopped")
				}
			}
			if lf.enabled {
				if lf.namespace == "" {
					lf.namespace = cf.namespace()
				}
				if err := runAsLeader(ctx, cl.core, lf, ld, runEngine); err != nil {
					return err
				}
			} else {
				runEngine(ctx)
			}
			<-watchDone
			logger.Info("Stopped")
			return nil
		},
	}
	rf.register(cmd)
	cf.register(cmd)
	cmd.Flags().StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 turns it off)")
	cmd.Flags().StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 turns them off)")
	cmd.Flags().DurationVar(&drainPeriod, "drain-timeout", 30*time.Second, "on shutdown, how long in-flight reconciles may take before their requests are cancelled")
	cmd.Flags().StringVar(&events, "events", string(engine.EventsWarnings), "Events on triggers: warnings (a Failed Event for each failure) or all (also one Normal Event for each reconcile that changed something)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the actions syncloop would take (computed with server-side dry-run requests) instead of taking them")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "with --dry-run, the plan format: text or json (one object per line)")
	cmd.Flags().BoolVar(&lf.enabled, "leader-elect", false, "run rules only while holding a coordination.k8s.io Lease, so that replicas stand by")
	cmd.Flags().StringVar(&lf.namespace, "leader-elect-namespace", "", "namespace of the Lease (default: the pod's, or the kubeconfig context's)")
	cmd.Flags().StringVar(&lf.id, "leader-elect-id", "syncloop", "name of the Lease")
	cmd.Flags().StringVar(&lf.identity, "leader-elect-identity", "", "this replica's identity in the Lease (default: hostname_uuid)")
	_ = cmd.Flags().MarkHidden("leader-elect-identity")
	return cmd
}

// runGCPercent is the garbage collector's target for `run` unless GOGC is
// set: syncloop's heap is mostly its informer caches, which live as long as
// the process, while what it allocates per request dies at once. Go's
// default (100) lets the heap grow to twice the caches before collecting;
// 50 keeps it at one and a half — measured with 5,000 triggers and 5,000
// children: 82–84 MiB resident instead of 95–96, for 3–8 % more CPU.
const runGCPercent = 50

func setGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(runGCPercent)
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

// fileErrors are the rule files that failed at the last load, for /readyz.
type fileErrors struct {
	mu   sync.Mutex
	errs []reload.FileError
}

// report logs each failed file and remembers them.
func (f *fileErrors) report(logger klog.Logger, errs []reload.FileError) {
	for _, e := range errs {
		logger.Error(e.Err, "Rule file not loaded", "file", e.Path, "lastGoodVersionInForce", e.LastGood)
	}
	f.mu.Lock()
	f.errs = errs
	f.mu.Unlock()
}

func (f *fileErrors) get() []reload.FileError {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs
}

// probes serves /healthz (the process runs) and /readyz (every rule's
// informers have synced; the body lists each rule's state, why one is not
// running, and the rule files that failed to load).
func probes(eng *engine.Engine, files *fileErrors, ld *leader) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ld.isLeading() {
			// A standby is ready: it takes over as soon as the Lease is free.
			fmt.Fprintln(w, "standby: another replica holds the leader Lease")
			for _, e := range files.get() {
				fmt.Fprintf(w, "file %s: %v\n", e.Path, e)
			}
			return
		}
		states := eng.States()
		sort.Slice(states, func(i, j int) bool { return states[i].Rule < states[j].Rule })
		var b strings.Builder
		for _, s := range states {
			fmt.Fprintf(&b, "rule %s: %s", s.Rule, s.State)
			if s.Detail != "" {
				fmt.Fprintf(&b, ": %s", s.Detail)
			}
			b.WriteByte('\n')
		}
		for _, e := range files.get() {
			fmt.Fprintf(&b, "file %s: %v\n", e.Path, e)
		}
		if !eng.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprint(w, b.String())
	})
	return mux
}

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
