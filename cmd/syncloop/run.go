package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/rules"
)

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

// clients makes the API clients of the flags' configuration.
func (f *clusterFlags) clients() (*manager.Clients, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the client configuration: %w", err)
	}
	return manager.NewClients(cfg, nil)
}

// clientConfig is the client configuration the flags name, loaded the way
// kubectl loads it: --kubeconfig, $KUBECONFIG, ~/.kube/config, then
// in-cluster.
func (f *clusterFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context})
}

// restConfig loads the client configuration the way kubectl does.
func (f *clusterFlags) restConfig() (*rest.Config, error) {
	cfg, err := f.clientConfig().ClientConfig()
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
	ns, _, err := f.clientConfig().Namespace()
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
		leaderElect bool
		sharding    bool
		leaseNS     string
		leaseID     string
		identity    string
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
			if leaderElect && sharding {
				return errors.New("--leader-elect and --sharding are exclusive: one replica works, or all share the work")
			}
			eventMode, err := engine.ParseEventMode(events)
			if err != nil {
				return fmt.Errorf("--%w", err)
			}
			cfg, err := cf.restConfig()
			if err != nil {
				return fmt.Errorf("loading the client configuration: %w", err)
			}
			if leaseNS == "" {
				leaseNS = cf.namespace()
			}
			if err := rules.ValidateInstallation(rf.installation); err != nil {
				return fmt.Errorf("--%w", err)
			}
			if rf.installation != "" && !cmd.Flags().Changed("leader-elect-id") {
				leaseID += "-" + rf.installation // installations elect their leaders apart
			}
			var mode manager.Mode
			switch {
			case leaderElect:
				mode = &manager.LeaderElection{Namespace: leaseNS, Name: leaseID, Identity: identity}
			case sharding:
				mode = &manager.Sharding{Namespace: leaseNS, Group: leaseID, Identity: identity}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return manager.Run(ctx, manager.Options{
				Config:       cfg,
				Rules:        rf.paths,
				CostLimit:    rf.costLimit,
				Installation: rf.installation,
				Namespace:    cf.watchNamespace,
				MetricsAddr:  metricsAddr,
				ProbeAddr:    probeAddr,
				DrainTimeout: drainPeriod,
				Events:       eventMode,
				DryRun:       dryRun,
				PlanJSON:     output == "json",
				Stdout:       cmd.OutOrStdout(),
				Stderr:       cmd.ErrOrStderr(),
				Mode:         mode,
			})
		},
	}
	rf.register(cmd)
	rf.registerInstallation(cmd)
	cf.register(cmd)
	cmd.Flags().StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of /metrics (0 turns it off)")
	cmd.Flags().StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 turns them off)")
	cmd.Flags().DurationVar(&drainPeriod, "drain-timeout", 30*time.Second, "on shutdown, how long in-flight reconciles may take before their requests are cancelled")
	cmd.Flags().StringVar(&events, "events", string(engine.EventsWarnings), "Events on triggers: warnings (a Failed Event for each failure) or all (also one Normal Event for each reconcile that changed something)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print the actions syncloop would take (computed with server-side dry-run requests) instead of taking them")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "with --dry-run, the plan format: text or json (one object per line)")
	cmd.Flags().BoolVar(&leaderElect, "leader-elect", false, "run rules only while holding a coordination.k8s.io Lease, so that replicas stand by")
	cmd.Flags().BoolVar(&sharding, "sharding", false, "share the triggers with the other replicas run this way, each holding a coordination.k8s.io Lease of its own (<leader-elect-id>-shard-<identity>)")
	cmd.Flags().StringVar(&leaseNS, "leader-elect-namespace", "", "namespace of the Leases of --leader-elect and --sharding (default: the pod's, or the kubeconfig context's)")
	cmd.Flags().StringVar(&leaseID, "leader-elect-id", "syncloop", "name of the leader Lease; with --sharding, the group's name (default with --installation: syncloop-<installation>)")
	cmd.Flags().StringVar(&identity, "leader-elect-identity", "", "this replica's identity (default: hostname_uuid; with --sharding, the host name, which is the pod's name)")
	_ = cmd.Flags().MarkHidden("leader-elect-identity")
	return cmd
}
