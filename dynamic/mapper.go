package dynamic

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// DefaultRefreshInterval is how often, at most, a mapping miss re-reads
// discovery.
const DefaultRefreshInterval = 2 * time.Second

// Mapper maps kinds to resources through API discovery. A kind it does not
// know makes it re-read discovery — at most once per refresh interval — so a
// CustomResourceDefinition installed after start is found without a restart,
// while a kind that does not exist does not turn every lookup into a
// discovery storm. Mappings found are cached. Safe for concurrent use.
type Mapper struct {
	delegate *restmapper.DeferredDiscoveryRESTMapper
	interval time.Duration
	now      func() time.Time

	mu        sync.RWMutex
	cache     map[schema.GroupVersionKind]*meta.RESTMapping
	lastReset time.Time
}

// NewMapper returns a Mapper over dc. interval 0 means DefaultRefreshInterval.
func NewMapper(dc discovery.DiscoveryInterface, interval time.Duration) *Mapper {
	if interval == 0 {
		interval = DefaultRefreshInterval
	}
	return &Mapper{
		delegate: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		interval: interval,
		now:      time.Now,
		cache:    map[schema.GroupVersionKind]*meta.RESTMapping{},
	}
}

// Mapping returns the resource of gvk. Its error satisfies
// meta.IsNoMatchError when the server does not serve the kind (yet).
func (m *Mapper) Mapping(ctx context.Context, gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	m.mu.RLock()
	mapping, ok := m.cache[gvk]
	m.mu.RUnlock()
	if ok {
		return mapping, nil
	}
	mapping, err := m.delegate.RESTMappingWithContext(ctx, gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) && m.mayRefresh() {
		m.delegate.ResetWithContext(ctx)
		mapping, err = m.delegate.RESTMappingWithContext(ctx, gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.cache[gvk] = mapping
	m.mu.Unlock()
	return mapping, nil
}

// mayRefresh reports whether discovery may be re-read now, and if so notes
// that it is.
func (m *Mapper) mayRefresh() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now := m.now(); now.Sub(m.lastReset) >= m.interval {
		m.lastReset = now
		return true
	}
	return false
}

// Namespaced reports whether gvk is a namespaced kind.
func (m *Mapper) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	mapping, err := m.Mapping(context.Background(), gvk)
	if err != nil {
		return false, err
	}
	return mapping.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// Scope reports whether gvk is namespaced, and false for known when the
// server does not serve it or cannot be asked (rules.ScopeSource: the
// load-time checks skip kinds whose scope is not known).
func (m *Mapper) Scope(gvk schema.GroupVersionKind) (namespaced, known bool) {
	ns, err := m.Namespaced(gvk)
	return ns, err == nil
}

// Forget drops the cached mapping of gvk, e.g. after its CRD was deleted.
func (m *Mapper) Forget(gvk schema.GroupVersionKind) {
	m.mu.Lock()
	delete(m.cache, gvk)
	m.mu.Unlock()
}
