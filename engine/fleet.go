package engine

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// Fleet is the inventory of clusters the children of rules that target
// clusters (rules.Resource.Clusters) go to: internal/fleet's, made of
// kubeconfig Secrets. The engine does not know where a cluster is, only
// how to reach it.
type Fleet interface {
	// Clusters are the clusters of the inventory, by name.
	Clusters() []rules.Cluster
	// Reach is how to reach the cluster named name; false when the
	// inventory has none of that name.
	Reach(name string) (dynamic.Remote, bool)
	// LeftOut says why a cluster a Secret names is not in the inventory
	// (its kubeconfig was refused), or nil.
	LeftOut(name string) error
	// Subscribe has f called, without blocking, whenever the inventory
	// changes or a cluster stops or starts answering.
	Subscribe(f func()) (cancel func())
	// WaitForSync waits until the inventory is complete (its Secrets
	// listed), or ctx ends.
	WaitForSync(ctx context.Context) bool
}

// A place is one cluster of the fleet as one rule's loop uses it: the
// informers of the rule's children there (its own, one per kind, holding
// only this installation's children of the rule) and a reconciler that
// applies, repairs and prunes them there with that cluster's client. It
// shares nothing with another cluster's: its own memory of its writes,
// its own fights.
type place struct {
	cluster string
	remote  dynamic.Remote
	w       *watches
	rc      *reconciler
	// err says why the rule's kinds could not be found or watched there.
	err error
	// leave is what the triggers selected, for their children that leave
	// the cluster (onLeave: Delete).
	leave *leaves
	// returns is the cluster's Returns when the place was made.
	returns int
	// slots are the rule's workers that may wait on the cluster at once
	// (take).
	slots chan struct{}
}

// A cluster that hangs holds the workers that wait on it, each up to a
// request's deadline (dynamic.Bounds). So no more than a share of a
// rule's workers may wait on one cluster at once: the rule's other
// triggers, its children at home and in the other clusters go on. A
// reconcile that finds no slot free within slotWait leaves its children
// there waiting, as for a cluster that does not answer.
const (
	clusterShare = 4 // a cluster holds at most a quarter of the workers
	slotWait     = time.Second
)

// take takes one of p's slots, or is false when none is free within
// slotWait (or ctx ends); release gives it back.
func (p *place) take(ctx context.Context) (release func(), ok bool) {
	t := time.NewTimer(slotWait)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
		return func() { <-p.slots }, true
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, false
}

// busy is why a reconcile found no slot of p's.
func (p *place) busy() *render.UnreachableError {
	return &render.UnreachableError{Cluster: p.cluster, Why: fmt.Sprintf("%d of the rule's workers wait on it already: it answers too slowly", cap(p.slots))}
}

// stale reports whether p is to be made anew for remote: a new
// kubeconfig, kinds that could not be watched, or a cluster that has
// answered again since p was made (its informers may wait out a backoff
// grown while it did not: new ones list at once).
func (p *place) stale(remote dynamic.Remote) bool {
	return remote.Version != p.remote.Version || p.err != nil || (remote.Returns != nil && remote.Returns() != p.returns)
}

// unreachable says why the children in p cannot be brought about now —
// the cluster does not answer, its kinds could not be watched, or its
// informers have not listed yet — or nil.
func (p *place) unreachable() *render.UnreachableError {
	why := func(format string, args ...any) *render.UnreachableError {
		return &render.UnreachableError{Cluster: p.cluster, Why: fmt.Sprintf(format, args...)}
	}
	switch {
	case p.err != nil:
		return why("%v", p.err)
	case p.remote.Down != nil && p.remote.Down() != nil:
		return why("%v", p.remote.Down())
	}
	for _, ck := range p.w.children {
		if ck.sub == nil || !ck.sub.HasSynced() {
			if ck.sub != nil && ck.sub.LastError() != nil {
				return why("listing %s: %v", ck.mapping.Resource.GroupResource(), ck.sub.LastError())
			}
			return why("listing the rule's children there has not finished")
		}
	}
	return nil
}

// noAnswer tells the inventory that p's cluster does not answer, if err
// says so (a request that ctx did not end): its reachability is probed
// until it does, and its triggers queued then — not left to a backoff that
// grew while it was down.
func (p *place) noAnswer(ctx context.Context, err error) {
	if err != nil && ctx.Err() == nil && dynamic.NoAnswer(err) && p.remote.Failed != nil {
		p.remote.Failed(err)
	}
}

// loopFleet is one rule's places: one per cluster of the inventory the
// rule's resources may target, made as clusters join and dropped as they
// leave (their children stay as they are: a cluster leaving the
// inventory never deletes anything).
type loopFleet struct {
	l     *ruleLoop
	fleet Fleet
	poke  chan struct{}
	// ready is closed once the places of the inventory's clusters are
	// made and have listed (or a while has passed): the loop's workers
	// start then, so that a cold start does not find every cluster
	// unreachable.
	ready chan struct{}

	// leave is when to sweep the children leaving clusters (leave.go).
	leave leaveSweeps

	mu     sync.RWMutex
	places map[string]*place
}

func newLoopFleet(l *ruleLoop, f Fleet) *loopFleet {
	lf := &loopFleet{l: l, fleet: f, poke: make(chan struct{}, 1), ready: make(chan struct{}), places: map[string]*place{}}
	lf.leave.budget.Store(&l.rule.Rollout.MaxPrunes)
	return lf
}

// retryPlaces is how often a place whose kinds could not be watched is
// made again.
const retryPlaces = 10 * time.Second

// run keeps the places in line with the inventory until ctx ends, and
// queues every trigger when it changes: children wait for a cluster that
// returns, go to one that joins a selector. Each step contains a panic
// (PanicLoop): the step fails, the places and the loop go on.
func (lf *loopFleet) run(ctx context.Context) {
	cancel := lf.fleet.Subscribe(func() {
		select {
		case lf.poke <- struct{}{}:
		default:
		}
	})
	defer cancel()
	defer lf.stopAll()
	lf.l.step(ctx, lf.first)
	close(lf.ready)
	t := time.NewTicker(retryPlaces)
	defer t.Stop()
	sweeps := time.NewTicker(sweepEvery)
	defer sweeps.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lf.poke: // the inventory changed, a cluster stopped or started answering, a place listed
			lf.l.step(ctx, lf.resync)
		case <-t.C:
			lf.l.step(ctx, func(ctx context.Context) {
				if lf.sync(ctx) {
					lf.l.addAll()
				}
			})
		case <-sweeps.C:
			select {
			case <-lf.poke: // what changed first: its triggers are queued before any sweep
				lf.l.step(ctx, lf.resync)
			default:
				lf.l.step(ctx, lf.sweep)
			}
		}
	}
}

// first makes the places of the inventory's clusters once it is
// complete, and waits for their informers to list (or placeTimeout).
func (lf *loopFleet) first(ctx context.Context) {
	wctx, wcancel := context.WithTimeout(ctx, placeTimeout)
	defer wcancel()
	if !lf.fleet.WaitForSync(wctx) {
		return
	}
	lf.sync(ctx)
	for _, p := range lf.each() {
		for _, ck := range p.w.children {
			if ck.sub != nil {
				synced(wctx, ck.sub)
			}
		}
	}
}

// resync brings the places in line and queues every trigger.
func (lf *loopFleet) resync(ctx context.Context) {
	lf.sync(ctx)
	lf.l.addAll()
}

// sync makes a place for every cluster the rule may target, remakes the
// stale ones (place.stale), and drops those that left; it reports whether
// anything a reconcile reads changed.
func (lf *loopFleet) sync(ctx context.Context) bool {
	want := map[string]dynamic.Remote{}
	for _, c := range lf.fleet.Clusters() {
		if !lf.mayTarget(c) {
			continue
		}
		if r, ok := lf.fleet.Reach(c.Name); ok {
			want[c.Name] = r
		}
	}
	lf.mu.Lock()
	var stale []*place
	for name, p := range lf.places {
		if r, ok := want[name]; !ok || p.stale(r) {
			stale = append(stale, p)
			delete(lf.places, name)
		}
	}
	var missing []string
	for name := range want {
		if lf.places[name] == nil {
			missing = append(missing, name)
		}
	}
	lf.mu.Unlock()
	for _, p := range stale {
		p.w.unsubscribe()
	}
	sort.Strings(missing)
	for _, name := range missing {
		p := lf.newPlace(ctx, name, want[name])
		lf.mu.Lock()
		lf.places[name] = p
		lf.mu.Unlock()
	}
	return len(stale)+len(missing) > 0
}

// mayTarget reports whether a resource of the rule may put children in c.
func (lf *loopFleet) mayTarget(c rules.Cluster) bool {
	for _, res := range lf.l.rule.Resources {
		if res.Clusters != nil && res.Clusters.MayTarget(c) {
			return true
		}
	}
	return false
}

// placeTimeout bounds finding the rule's kinds in a cluster and starting
// its informers there.
const placeTimeout = 10 * time.Second

// newPlace makes the place of cluster name: its kinds mapped by the
// cluster's discovery, its informers subscribed (not waited for: the
// other clusters proceed meanwhile). A place whose kinds cannot be found
// is kept with its error, and made again later.
func (lf *loopFleet) newPlace(ctx context.Context, name string, remote dynamic.Remote) *place {
	l := lf.l
	a := l.e.actors.remotes.of(name, remote, l.e.actors)
	p := &place{cluster: name, remote: remote, leave: newLeaves(), slots: make(chan struct{}, max(1, l.rule.Workers/clusterShare))}
	if remote.Returns != nil {
		p.returns = remote.Returns()
	}
	p.w = &watches{rule: l.rule, actor: a, cluster: name, triggerMapping: l.watches.triggerMapping, children: map[schema.GroupVersionKind]*childKind{}}
	p.rc = newReconciler(l.rule, p.w, l.e.mapper, a.client, l.e.metrics, l.e.fights, func(writes *ownWrites) writer {
		return l.e.out.writer(l.rule, name, a.client, writes, l.add)
	})
	p.rc.later = l.rc.later
	mctx, cancel := context.WithTimeout(ctx, placeTimeout)
	defer cancel()
	for _, res := range l.rule.Resources {
		if res.Clusters == nil {
			continue
		}
		for _, k := range res.Kinds {
			if p.w.children[k.GVK] != nil {
				continue
			}
			m, err := remote.Mapper.Mapping(mctx, k.GVK)
			if err != nil {
				p.err = fmt.Errorf("kind %s: %w", k.GVK, err)
				if dynamic.NoAnswer(err) && remote.Failed != nil {
					remote.Failed(err)
				}
				return p
			}
			p.w.children[k.GVK] = &childKind{mapping: m}
		}
	}
	h := lf.handler(ctx, p)
	for _, ck := range p.w.children {
		sub, err := a.registry.Subscribe(ctx, p.w.childKey(ck), h)
		if err != nil {
			p.err = err
			p.w.unsubscribe()
			return p
		}
		ck.sub = sub
	}
	klog.FromContext(ctx).V(1).Info("Watching the rule's children in a cluster", "cluster", name, "kinds", len(p.w.children))
	go lf.pokeWhenSynced(ctx, p)
	return p
}

// pokeWhenSynced has the loop's triggers queued once p's informers have
// listed: the children that waited for the cluster go there.
func (lf *loopFleet) pokeWhenSynced(ctx context.Context, p *place) {
	for _, ck := range p.w.children {
		if !synced(ctx, ck.sub) {
			return
		}
	}
	select {
	case lf.poke <- struct{}{}:
	default:
	}
}

// handler is the event handler of p's child informers: a child changed
// or deleted there queues its trigger (drift repair), unless the event is
// the echo of syncloop's own apply.
func (lf *loopFleet) handler(ctx context.Context, p *place) cache.ResourceEventHandler {
	l := lf.l
	changed := func(obj any) {
		if o, ok := obj.(object); ok && p.rc.writes.echo(refOf(o), o.GetResourceVersion()) {
			return
		}
		l.enqueueOwner(obj)
	}
	return containedHandler{l: l, logger: klog.FromContext(ctx), queued: l.enqueueOwner, h: cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: func(obj any) {
			if o, ok := asObject(obj); ok {
				p.rc.writes.gone(refOf(o))
				p.rc.fights.gone(refOf(o))
			}
			l.enqueueOwner(obj)
		},
	}}
}

func (lf *loopFleet) stopAll() {
	lf.mu.Lock()
	places := lf.places
	lf.places = map[string]*place{}
	lf.mu.Unlock()
	for _, p := range places {
		p.w.unsubscribe()
	}
}

// placeOf is the place of cluster, or why its children cannot be brought
// about there now.
func (lf *loopFleet) placeOf(cluster string) (*place, *render.UnreachableError) {
	lf.mu.RLock()
	p := lf.places[cluster]
	lf.mu.RUnlock()
	if p == nil {
		why := "it is not in the inventory"
		if _, ok := lf.fleet.Reach(cluster); ok {
			why = "syncloop is connecting to it"
		} else if err := lf.fleet.LeftOut(cluster); err != nil {
			why = err.Error()
		}
		return nil, &render.UnreachableError{Cluster: cluster, Why: why}
	}
	if err := p.unreachable(); err != nil {
		return nil, err
	}
	return p, nil
}

// each is every place, by cluster name.
func (lf *loopFleet) each() []*place {
	lf.mu.RLock()
	out := make([]*place, 0, len(lf.places))
	for _, p := range lf.places {
		out = append(out, p)
	}
	lf.mu.RUnlock()
	slices.SortFunc(out, func(a, b *place) int { return strings.Compare(a.cluster, b.cluster) })
	return out
}

// FleetScoper is the render.Scoper of rule r's renders with a fleet:
// home's answer for every kind, but for a kind only r's resources that
// target clusters make the answer of the first of clusters() that can
// tell (home's when none can) — such a kind need not be served at home,
// and asking there for one that is not would re-read its discovery. The
// engine's clusters are its places' mappers; trace's, the inventory's.
func FleetScoper(home render.Scoper, r *rules.Rule, clusters func() []render.Scoper) render.Scoper {
	s := fleetScoper{home: home, clusters: clusters, remote: map[schema.GroupVersionKind]bool{}}
	for _, res := range r.Resources {
		for _, k := range res.Kinds {
			s.remote[k.GVK] = res.Targets()
		}
	}
	for _, res := range r.Resources {
		for _, k := range res.Kinds {
			if !res.Targets() {
				s.remote[k.GVK] = false // made at home too
			}
		}
	}
	return s
}

type fleetScoper struct {
	home     render.Scoper
	clusters func() []render.Scoper
	// remote are the kinds only resources that target clusters make.
	remote map[schema.GroupVersionKind]bool
}

func (s fleetScoper) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	if s.remote[gvk] {
		for _, c := range s.clusters() {
			if namespaced, err := c.Namespaced(gvk); err == nil {
				return namespaced, nil
			}
		}
	}
	return s.home.Namespaced(gvk) // not only the clusters', or no cluster can tell now
}

// mappers are the mappers of the places whose kinds could be mapped (the
// others would only wait on their clusters), for FleetScoper.
func (lf *loopFleet) mappers() []render.Scoper {
	var out []render.Scoper
	for _, p := range lf.each() {
		if p.err == nil && p.remote.Mapper != nil {
			out = append(out, p.remote.Mapper)
		}
	}
	return out
}

// startFleet runs the rule's places in the clusters of the fleet, if its
// resources target any, and waits until they are made and listed (or a
// while has passed: each reconcile finds the clusters it cannot reach yet,
// and their children wait there). stop ends them; false: ctx ended.
func (l *ruleLoop) startFleet(ctx context.Context) (stop func(), ok bool) {
	if l.fleet == nil {
		return func() {}, true
	}
	var done sync.WaitGroup
	fctx, cancel := context.WithCancel(ctx)
	done.Go(func() { l.fleet.run(fctx) })
	stop = func() { cancel(); done.Wait() }
	select {
	case <-l.fleet.ready:
		return stop, true
	case <-ctx.Done():
		return stop, false
	}
}
