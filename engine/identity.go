package engine

import (
	"fmt"
	"strings"
	"sync"

	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// An actor is an identity rules act as — syncloop's own, or a
// ServiceAccount it impersonates (rules.Rule.Identity) — with the informers
// its rules share and the client they read and write with. Rules of two
// identities share nothing: a cache filled by one identity's lists is
// never read by a rule of another, so a rule sees what its identity may
// list and writes what it may write, no more.
type actor struct {
	id       rules.ServiceAccount // zero: syncloop's own
	registry *dynamic.Registry
	client   *dynamic.Writer
}

// actors are the engine's identities, made as rules need them and
// forgotten once no rule acts as them.
type actors struct {
	base     *dynamic.Client // syncloop's own
	dryRun   bool
	indexers cache.Indexers
	setup    func(*dynamic.Registry)
	// fleet are the other clusters children of rules may go to (nil:
	// none); remotes the actors that reach them.
	fleet   Fleet
	remotes remoteActors

	mu sync.Mutex
	by map[rules.ServiceAccount]*actor
}

func newActors(base *dynamic.Client, dryRun bool, indexers cache.Indexers, setup func(*dynamic.Registry)) *actors {
	return &actors{base: base, dryRun: dryRun, indexers: indexers, setup: setup, by: map[rules.ServiceAccount]*actor{}}
}

// of returns the actor of identity id, made on first use.
func (as *actors) of(id rules.ServiceAccount) (*actor, error) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if a, ok := as.by[id]; ok {
		return a, nil
	}
	c := as.base
	if !id.IsZero() {
		if c == nil {
			return nil, fmt.Errorf("acting as ServiceAccount %s needs a client", id)
		}
		var err error
		if c, err = c.Impersonating(id.UserName()); err != nil {
			return nil, fmt.Errorf("impersonating ServiceAccount %s: %w", id, err)
		}
	}
	var dc k8sdynamic.Interface
	if c != nil {
		dc = c.Dynamic
	}
	reg := dynamic.NewRegistry(dc, as.indexers)
	reg.Protobuf = c.Protobuf()
	reg.Identity = id.String()
	as.setup(reg)
	a := &actor{id: id, registry: reg, client: &dynamic.Writer{Client: c, DryRun: as.dryRun}}
	as.by[id] = a
	return a, nil
}

// forget drops the actors of identities no rule in use acts as (and that
// run no informer), so that identities come and go — teams' rules added
// and removed — without leaving their clients behind.
func (as *actors) forget(inUse map[rules.ServiceAccount]bool) {
	as.mu.Lock()
	defer as.mu.Unlock()
	for id, a := range as.by {
		if !id.IsZero() && !inUse[id] && a.registry.Len() == 0 {
			delete(as.by, id)
		}
	}
}

// each calls f with every actor made so far.
func (as *actors) each(f func(*actor)) {
	as.mu.Lock()
	defer as.mu.Unlock()
	for _, a := range as.by {
		f(a)
	}
}

// informers is how many shared informers run, under every identity.
func (as *actors) informers() int {
	n := 0
	as.each(func(a *actor) { n += a.registry.Len() })
	return n
}

// shutdown stops every informer of every identity.
func (as *actors) shutdown() {
	as.each(func(a *actor) { a.registry.Shutdown() })
}

// keys are the watch keys of the informers running, under every identity.
func (as *actors) keys() []dynamic.WatchKey {
	var out []dynamic.WatchKey
	as.each(func(a *actor) { out = append(out, a.registry.Keys()...) })
	return out
}

// remoteActors are the actors of the fleet's clusters (Fleet): one per
// cluster and kubeconfig version, acting as whoever that kubeconfig says
// — no ServiceAccount of this cluster is anyone there. Those of a
// kubeconfig replaced, or of a cluster gone, are dropped once no rule
// watches through them.
type remoteActors struct {
	mu sync.Mutex
	by map[string]*actor // by name@version
}

// of is the actor of cluster name reached through r, made on first use,
// its informers set up as local ones are (as's), and its failed watches
// telling r that the cluster does not answer.
func (ra *remoteActors) of(name string, r dynamic.Remote, as *actors) *actor {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	if ra.by == nil {
		ra.by = map[string]*actor{}
	}
	key := name + "@" + r.Version
	if a, ok := ra.by[key]; ok {
		return a
	}
	for k, a := range ra.by {
		if strings.HasPrefix(k, name+"@") && a.registry.Len() == 0 {
			delete(ra.by, k)
		}
	}
	reg := dynamic.NewRegistry(r.Client.Dynamic, as.indexers)
	reg.Protobuf = r.Client.Protobuf()
	reg.Identity = "cluster " + name
	as.setup(reg)
	counted := reg.OnWatchError
	reg.OnWatchError = func(key dynamic.WatchKey, err error) {
		if counted != nil {
			counted(key, err)
		}
		if dynamic.NoAnswer(err) && r.Failed != nil {
			r.Failed(err)
		}
	}
	a := &actor{registry: reg, client: &dynamic.Writer{Client: r.Client, DryRun: as.dryRun}}
	ra.by[key] = a
	return a
}

// each calls f with every remote actor.
func (ra *remoteActors) each(f func(*actor)) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for _, a := range ra.by {
		f(a)
	}
}
