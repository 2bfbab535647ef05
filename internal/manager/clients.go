package manager

import (
	"context"
	"sync/atomic"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	clientmetrics "k8s.io/client-go/tools/metrics"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/metrics"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// Clients are the API clients a cluster command needs.
type Clients struct {
	Config    *rest.Config
	Dynamic   *dynamic.Client
	Discovery discovery.DiscoveryInterface
	Core      kubernetes.Interface
	Metadata  metadata.Interface
	// Mapper maps the cluster's kinds to resources; it also tells rule
	// loads which kinds are namespaced.
	Mapper *dynamic.Mapper
	// OpenAPI reads the cluster's OpenAPI v3 documents, and Schemas the
	// kinds' schemas from them (built-in kinds compiled in), for loading
	// rules typed by what is installed.
	OpenAPI *dynamic.OpenAPI
	Schemas *kinds.Served
}

// NewClients makes the API clients of cfg (which it changes); every request
// of all of them passes one dynamic.FlowControl, which reports to fm (nil:
// nowhere).
func NewClients(cfg *rest.Config, fm dynamic.FlowMetrics) (*Clients, error) {
	cfg.Wrap(dynamic.NewFlowControl(fm).Wrap)
	c := &Clients{Config: cfg}
	var err error
	if c.Dynamic, err = dynamic.NewClient(cfg); err != nil {
		return nil, err
	}
	if c.Discovery, err = discovery.NewDiscoveryClientForConfig(cfg); err != nil {
		return nil, err
	}
	if c.Core, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.Metadata, err = metadata.NewForConfig(cfg); err != nil {
		return nil, err
	}
	c.Mapper = dynamic.NewMapper(c.Discovery, 0)
	c.OpenAPI = dynamic.NewOpenAPI(c.Discovery)
	c.Schemas = kinds.NewServed(c.OpenAPI.Document, kinds.Builtin())
	return c, nil
}

// restRequests forwards client-go's API request counts to the running
// manager's metrics. client-go takes this hook process-wide and once, so it
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
