package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/fleet"
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
	manageCRDs     bool
	// migrationQPS is run's --storage-migration-qps.
	migrationQPS float64
	// clusters are where the cluster inventory's Secrets are, and what
	// their kubeconfigs may do.
	clusters manager.Clusters
}

func (f *clusterFlags) register(cmd *cobra.Command) {
	f.registerKubeconfig(cmd)
	cmd.Flags().Float32Var(&f.qps, "qps", 0, "cap on API requests per second, client-side (default 0: no cap; syncloop adapts to the API server's flow control)")
	cmd.Flags().IntVar(&f.burst, "burst", 0, "with --qps, the burst of API requests allowed over the cap (default 0: twice --qps)")
	cmd.Flags().StringVar(&f.watchNamespace, "watch-namespace", "", "limit syncloop to this namespace, so that it needs no cluster-wide rights: rules must watch and make namespaced kinds there")
	f.registerClustersNamespace(cmd)
	cmd.Flags().BoolVar(&f.manageCRDs, "manage-crds", true, "apply the CustomResourceDefinitions of the kinds rules define (spec.api); false: they come from elsewhere (GitOps, syncloop crds) and are only checked")
}

// registerClustersNamespace adds --clusters-namespace, where the fleet's
// kubeconfig Secrets are, and the --insecure-kubeconfig-* flags, what they
// may do besides inline credentials: run, plan and trace read them alike.
func (f *clusterFlags) registerClustersNamespace(cmd *cobra.Command) {
	trust := &f.clusters.Trust
	cmd.Flags().BoolVar(&trust.Exec, strings.TrimPrefix(fleet.FlagExec, "--"), false, "INSECURE: let the fleet's kubeconfig Secrets run exec and auth-provider plugins and read files (tokenFile, client-certificate, client-key, certificate-authority): whoever may write a Secret in --clusters-namespace may then run a program as syncloop and read its files, its ServiceAccount token included")
	cmd.Flags().BoolVar(&trust.TLS, strings.TrimPrefix(fleet.FlagTLS, "--"), false, "INSECURE: let the fleet's kubeconfig Secrets skip TLS verification (insecure-skip-tls-verify) and name plain http servers: syncloop's requests to those clusters, their credentials included, may be read and answered by anyone on the way")
	cmd.Flags().BoolVar(&trust.Proxy, strings.TrimPrefix(fleet.FlagProxy, "--"), false, "INSECURE: let the fleet's kubeconfig Secrets send syncloop's requests through a proxy (proxy-url) of the Secret writer's choosing, credentials included")
	cmd.Flags().DurationVar(&f.clusters.RequestTimeout, "cluster-request-timeout", dynamic.DefaultRemoteTimeout, "deadline of each request to a cluster of the fleet but a watch, its answer read whole: a cluster that does not answer within it is set aside as not answering, and holds no more workers")
	cmd.Flags().StringVar(&f.clusters.Namespace, "clusters-namespace", "", "namespace of the cluster inventory: the kubeconfig Secrets labelled "+rules.LabelClusterName+" (key value, as Cluster API writes them) of the clusters rules put children in with clusters: (default: syncloop's namespace, run's --leader-elect-namespace, plan's and trace's --syncloop-namespace)")
}

// registerKubeconfig adds only --kubeconfig and --context, for commands
// that read a few objects.
func (f *clusterFlags) registerKubeconfig(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	cmd.Flags().StringVar(&f.context, "context", "", "kubeconfig context to use")
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

// runFlags are the flags of run.
type runFlags struct {
	rf                    ruleFlags
	cf                    clusterFlags
	serve                 manager.Addresses
	drainPeriod           time.Duration
	dryRun                bool
	output, events        string
	leaderElect, sharding bool
	leaseNS, leaseID      string
	rulesConfigMap        string
	tenantRules           bool
	identity              string
	compression           bool
}

func newRunCommand() *cobra.Command {
	var f runFlags
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
			o, err := f.options(cmd)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return manager.Run(ctx, o)
		},
	}
	f.register(cmd)
	return cmd
}

func (f *runFlags) register(cmd *cobra.Command) {
	f.rf.register(cmd)
	f.rf.webhook.register(cmd)
	f.rf.registerInstallation(cmd)
	f.rf.registerIdentity(cmd)
	f.cf.register(cmd)
	cmd.Flags().StringVar(&f.serve.Metrics, "metrics-bind-address", ":8080", "address of /metrics (0 turns it off)")
	cmd.Flags().StringVar(&f.serve.Probes, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (0 turns them off)")
	cmd.Flags().Float64Var(&f.cf.migrationQPS, "storage-migration-qps", manager.DefaultMigrationQPS, "objects per second a storage migration rewrites, when a kind a rule defines changes its storage version")
	cmd.Flags().StringVar(&f.rf.webhook.certManager, "webhook-cert-manager", "", "NAMESPACE/NAME of the cert-manager Certificate that issues the conversion webhook's certificate into its Secret (the chart's webhook.certManager): syncloop then only reads the Secret, and the CRDs trust the Certificate's CA through cert-manager's CA injector")
	cmd.Flags().StringVar(&f.rf.webhook.clientCA, "webhook-client-ca", "", "PEM file of the CAs whose client certificate the conversion webhook requires of its callers (the chart's webhook.clientCA), read again when it changes; off by default — kube-apiserver presents none to CRD conversion webhooks as of Kubernetes 1.37: see docs/cli.md")
	cmd.Flags().StringVar(&f.serve.Webhook, "webhook-bind-address", "0", "address of the conversion webhook (/convert, TLS) of the kinds rules define in several versions, e.g. :9443 (the chart sets it: every replica serves it); 0: off, the CRDs then convert through a webhook served elsewhere")
	cmd.Flags().StringVar(&f.serve.Pprof, "pprof-bind-address", "", "address of /debug/pprof/, Go's profiler (empty or 0: off)")
	cmd.Flags().DurationVar(&f.drainPeriod, "drain-timeout", 30*time.Second, "on shutdown, how long in-flight reconciles may take before their requests are cancelled")
	cmd.Flags().StringVar(&f.events, "events", "warnings", "Events on triggers: warnings (a Failed Event for each failure) or all (also one Normal Event for each reconcile that changed something)")
	cmd.Flags().BoolVar(&f.dryRun, "dry-run", false, "print the actions syncloop would take (computed with server-side dry-run requests) instead of taking them")
	cmd.Flags().StringVarP(&f.output, "output", "o", "text", "with --dry-run, the plan format: text or json (one object per line)")
	cmd.Flags().BoolVar(&f.leaderElect, "leader-elect", false, "run rules only while holding a coordination.k8s.io Lease, so that replicas stand by")
	cmd.Flags().BoolVar(&f.sharding, "sharding", false, "share the triggers with the other replicas run this way, each holding a coordination.k8s.io Lease of its own (<leader-elect-id>-shard-<identity>)")
	cmd.Flags().StringVar(&f.leaseNS, "leader-elect-namespace", "", "namespace of the Leases of --leader-elect and --sharding, and of the rules' revisions (default: the pod's, or the kubeconfig context's)")
	cmd.Flags().StringVar(&f.leaseID, "leader-elect-id", "syncloop", "name of the leader Lease; with --sharding, the group's name (default with --installation: syncloop-<installation>)")
	cmd.Flags().StringVar(&f.identity, "leader-elect-identity", "", "this replica's identity (default: hostname_uuid; with --sharding, the host name, which is the pod's name)")
	_ = cmd.Flags().MarkHidden("leader-elect-identity")
	cmd.Flags().BoolVar(&f.tenantRules, "tenant-rules", false, "also read rules from the ConfigMaps labelled "+rules.LabelTenantRules+"=true in every namespace (or --watch-namespace's): each key a rule file of that namespace's team, named <namespace>.<name>, acting as a ServiceAccount of the namespace and confined to it; why one does not load is a Warning Event on its ConfigMap")
	cmd.Flags().BoolVar(&f.compression, "api-compression", false, "ask the API server to gzip its responses and watch streams; off by default, as kube-controller-manager and kube-scheduler have it, because on a cluster's own network compressing costs the API server and syncloop more CPU than the bytes save (on for a distant API server over a slow link)")
	cmd.Flags().StringVar(&f.rulesConfigMap, "rules-configmap", "", "NAMESPACE/NAME of the ConfigMap the rule files are mounted from: why a file did not load becomes a Warning Event on it (the chart sets it)")
}

// options turns the flags into the manager's options.
func (f *runFlags) options(cmd *cobra.Command) (manager.Options, error) {
	if f.output != "text" && f.output != "json" {
		return manager.Options{}, fmt.Errorf("--output must be text or json, not %q", f.output)
	}
	if f.leaderElect && f.sharding {
		return manager.Options{}, errors.New("--leader-elect and --sharding are exclusive: one replica works, or all share the work")
	}
	cfg, err := f.cf.restConfig()
	if err != nil {
		return manager.Options{}, fmt.Errorf("loading the client configuration: %w", err)
	}
	cfg.DisableCompression = !f.compression
	if err := rules.ValidateInstallation(f.rf.installation); err != nil {
		return manager.Options{}, fmt.Errorf("--%w", err)
	}
	leaseNS, leaseID := f.leaseNS, f.leaseID
	if leaseNS == "" {
		leaseNS = f.cf.namespace()
	}
	if f.rf.installation != "" && !cmd.Flags().Changed("leader-elect-id") {
		leaseID += "-" + f.rf.installation // installations elect their leaders apart
	}
	var dryRun *manager.DryRun
	if f.dryRun {
		dryRun = &manager.DryRun{JSON: f.output == "json", Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr()}
	}
	var mode manager.Mode
	switch {
	case f.leaderElect:
		mode = &manager.LeaderElection{Namespace: leaseNS, Name: leaseID, Identity: f.identity}
	case f.sharding:
		mode = &manager.Sharding{Namespace: leaseNS, Group: leaseID, Identity: f.identity}
	}
	defaultSA, err := f.rf.defaultServiceAccount()
	if err != nil {
		return manager.Options{}, err
	}
	webhook, err := f.rf.webhook.config()
	if err != nil {
		return manager.Options{}, err
	}
	if c := f.rf.webhook.certManager; c != "" {
		if ns, name, ok := strings.Cut(c, "/"); !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return manager.Options{}, fmt.Errorf("--webhook-cert-manager %q: NAMESPACE/NAME of a cert-manager Certificate", c)
		}
	}
	if c := f.rf.webhook.clientCA; c != "" && (f.serve.Webhook == "" || f.serve.Webhook == "0") {
		return manager.Options{}, fmt.Errorf("--webhook-client-ca %q: the webhook is not served here (--webhook-bind-address)", c)
	}
	return manager.Options{
		Config:       cfg,
		Rules:        f.rf.paths,
		CostLimit:    f.rf.costLimit,
		Installation: f.rf.installation,
		Namespace:    f.cf.watchNamespace,
		Serve:        f.serve,
		DrainTimeout: f.drainPeriod,
		Events:       f.events,
		DryRun:       dryRun,
		Mode:         mode,
		CRDs: manager.CRDs{NoManage: !f.cf.manageCRDs, Webhook: webhook, MigrationQPS: f.cf.migrationQPS,
			CertManager: f.rf.webhook.certManager, ClientCA: f.rf.webhook.clientCA},
		// syncloop's own objects live with its Leases.
		SyncloopNamespace: leaseNS,
		RulesConfigMap:    f.rulesConfigMap,
		Clusters:          f.cf.clusters,
		// Rules act as it unless they name a ServiceAccount of their own.
		Identities: manager.Identities{Default: defaultSA, Tenants: f.tenantRules},
	}, nil
}
