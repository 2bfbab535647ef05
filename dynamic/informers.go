package dynamic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// WatchKey identifies one shared informer: a resource, a namespace (empty
// for all) and the selectors sent to the API server, in their canonical
// string forms. It is comparable, so identical watches share one informer
// and one watch connection.
type WatchKey struct {
	GVR           schema.GroupVersionResource
	Namespace     string
	LabelSelector string
	FieldSelector string
	// Filter, when set, makes the informer cache only the objects the
	// Registry's Keep keeps: the others are dropped as they are decoded
	// from its lists and watches. Its value is the subscriber's, passed to
	// Keep. Informers that filter and those that do not never share.
	Filter string
}

func (k WatchKey) String() string {
	s := k.GVR.Resource
	if k.GVR.Group != "" {
		s += "." + k.GVR.Group
	}
	s += "/" + k.GVR.Version
	if k.Namespace != "" {
		s += " in " + k.Namespace
	}
	if k.LabelSelector != "" {
		s += " labels " + k.LabelSelector
	}
	if k.FieldSelector != "" {
		s += " fields " + k.FieldSelector
	}
	if k.Filter != "" {
		s += " filter " + k.Filter
	}
	return s
}

// Registry runs one shared informer per distinct WatchKey for as long as it
// has subscribers: the first Subscribe starts it, the last Subscription.Stop
// stops it and waits for it to end. Objects are cached without
// managedFields (but the entries KeepManagedFields selects). Safe for
// concurrent use.
//
// The Registry knows nothing of what its subscribers do with events; it does
// not queue, filter or reconcile.
type Registry struct {
	client   dynamic.Interface
	indexers cache.Indexers

	// OnWatchStart, when set before the first Subscribe, is called with
	// the key of each informer before it starts: before it may fail.
	OnWatchStart func(key WatchKey)

	// OnWatchError, when set before the first Subscribe, is called with
	// every failed list or watch of an informer (its reflector then retries
	// with backoff, as client-go's do).
	OnWatchError func(key WatchKey, err error)

	// KeepManagedFields, when set before the first Subscribe, says which
	// field managers' managedFields entries the caches keep; every other
	// entry is dropped (all of them when it is nil).
	KeepManagedFields func(manager string) bool

	// Protobuf, when set before the first Subscribe, lists and watches the
	// kinds it serves (client-go's) in protobuf; the others, and all when
	// it is nil, are JSON through client.
	Protobuf *Protobuf

	// Keep, when set before the first Subscribe, says which objects the
	// informers of keys with a Filter cache. It is asked as each object
	// arrives from a list or a watch, so what it answers takes hold for
	// objects that do not change only on Refresh (or, for those it keeps
	// no more, Drop). obj is the decoded object, unstructured or typed
	// (protobuf); it must not be modified. Nil keeps every object.
	Keep func(key WatchKey, obj metav1.Object) bool

	// Identity, when set before the first Subscribe, names who the
	// client's requests act as (a ServiceAccount it impersonates, as
	// namespace/name) in the log of a refused list or watch; "" is
	// syncloop's own.
	Identity string

	mu      sync.Mutex
	entries map[WatchKey]*entry
}

type entry struct {
	key     WatchKey
	run     atomic.Pointer[informerRun] // the informer; Refresh replaces it
	subs    map[*Subscription]bool      // guarded by the Registry's mu
	lastErr atomic.Pointer[error]       // the last failed list or watch
}

// informerRun is one informer and how to stop it.
type informerRun struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{} // closed when the informer's goroutine has returned
}

func (e *entry) informer() cache.SharedIndexInformer { return e.run.Load().informer }

// NewRegistry returns a Registry whose informers list and watch through
// client. Every informer gets the namespace index and indexers.
func NewRegistry(client dynamic.Interface, indexers cache.Indexers) *Registry {
	all := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for k, v := range indexers {
		all[k] = v
	}
	return &Registry{client: client, indexers: all, entries: map[WatchKey]*entry{}}
}

// Subscribe adds handler to the informer for key, starting the informer if
// it is the first subscriber. A handler added to a running informer is first
// sent an Add for every cached object. ctx carries the logger; its
// cancellation does not stop the informer — Stop does.
//
// Handlers must not modify the objects they receive: they are the cache's.
func (r *Registry) Subscribe(ctx context.Context, key WatchKey, handler cache.ResourceEventHandler) (*Subscription, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[key]
	if !ok {
		e = &entry{key: key, subs: map[*Subscription]bool{}}
		run, err := r.start(ctx, e)
		if err != nil {
			return nil, err
		}
		e.run.Store(run)
		r.entries[key] = e
	}
	reg, err := e.informer().AddEventHandler(handler)
	if err != nil {
		if len(e.subs) == 0 {
			delete(r.entries, key)
			e.stop()
		}
		return nil, fmt.Errorf("subscribing to %s: %w", key, err)
	}
	s := &Subscription{r: r, e: e, handler: handler}
	s.reg.Store(&reg)
	e.subs[s] = true
	return s, nil
}

// start runs an informer on e's key; a list or watch it fails is e's
// last error.
func (r *Registry) start(ctx context.Context, e *entry) (*informerRun, error) {
	key := e.key
	tweak := func(o *metav1.ListOptions) {
		o.LabelSelector = key.LabelSelector
		o.FieldSelector = key.FieldSelector
	}
	var filter *keepFilter
	if key.Filter != "" && r.Keep != nil {
		filter = newKeepFilter(key, r.Keep)
	}
	jsonLW := r.jsonListWatch(key, tweak)
	if filter != nil {
		jsonLW = filter.listWatch(jsonLW)
	}
	options := cache.SharedIndexInformerOptions{Indexers: r.indexers, ObjectDescription: key.GVR.String()}
	var inf cache.SharedIndexInformer
	switch {
	case r.Protobuf.serves(ctx, key.GVR):
		// ConfigMaps and Secrets are cached typed (cached.go), the rest
		// unstructured.
		var example runtime.Object = &unstructured.Unstructured{}
		if mk, ok := typedCached[key.GVR]; ok {
			example = mk()
			if filter != nil {
				filter.example = mk
			}
		}
		convert := func(obj runtime.Object) (runtime.Object, error) {
			if readyTyped(obj, r.KeepManagedFields) {
				return obj, nil
			}
			return typedToUnstructured(obj, key.GVR.GroupVersion(), r.KeepManagedFields)
		}
		inf = cache.NewSharedIndexInformerWithOptions(r.Protobuf.listWatch(key, tweak, convert, filter, jsonLW), example, options)
	case filter != nil:
		inf = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(jsonLW, r.client), &unstructured.Unstructured{}, options)
	default:
		inf = dynamicinformer.NewFilteredDynamicInformer(r.client, key.GVR, key.Namespace, 0, r.indexers, tweak).Informer()
	}
	if filter != nil {
		filter.cache = inf.GetIndexer()
	}
	if err := inf.SetTransform(r.transformFor()); err != nil {
		return nil, err
	}
	ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ictx = klog.NewContext(ictx, klog.FromContext(ctx).WithValues("watch", key.String()))
	run := &informerRun{informer: inf, cancel: cancel, done: make(chan struct{})}
	if r.OnWatchStart != nil {
		r.OnWatchStart(key)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		e.lastErr.Store(&err)
		logWatchError(ctx, r.Identity, err)
		if r.OnWatchError != nil {
			r.OnWatchError(key, err)
		}
	}); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(run.done)
		inf.RunWithContext(ictx)
	}()
	return run, nil
}

// Refresh lists key's objects again on a new informer and, once it has
// synced, moves every subscription to it and stops the old one: what Keep
// answers now takes hold for every object, those it did not keep before
// among them. Until then the subscriptions
// read and are sent events from the old informer. Each handler is sent an
// Add for every object of the new list, as a new subscriber is; an object
// deleted between the two lists is not sent a Delete. Refresh returns
// when the new informer is in place and every handler has been sent its
// list, when the key has no subscriber any more (nil), or when ctx ends
// (its error before the swap, and the old informer stays).
func (r *Registry) Refresh(ctx context.Context, key WatchKey) error {
	r.mu.Lock()
	e := r.entries[key]
	r.mu.Unlock()
	if e == nil {
		return nil
	}
	run, err := r.start(ctx, e)
	if err != nil {
		return err
	}
	if !cache.WaitFor(ctx, "", run.informer.HasSyncedChecker()) {
		run.stop()
		return ctx.Err()
	}
	r.mu.Lock()
	if r.entries[key] != e || len(e.subs) == 0 {
		r.mu.Unlock()
		run.stop()
		return nil
	}
	old := e.run.Swap(run)
	var errs []error
	var synced []cache.DoneChecker
	for s := range e.subs {
		reg, err := run.informer.AddEventHandler(s.handler)
		if err != nil {
			errs = append(errs, err) // stopped: never, it runs
			continue
		}
		prev := s.reg.Swap(&reg)
		_ = old.informer.RemoveEventHandler(*prev)
		synced = append(synced, reg.HasSyncedChecker())
	}
	r.mu.Unlock()
	old.stop()
	// Each handler has been sent the new list (or ctx ended) once this
	// returns: the subscriptions have synced again.
	cache.WaitFor(ctx, "", synced...)
	return errors.Join(errs...)
}

// jsonListWatch lists and watches key through the dynamic client, as the
// dynamic informer does.
func (r *Registry) jsonListWatch(key WatchKey, tweak func(*metav1.ListOptions)) *cache.ListWatch {
	resource := r.client.Resource(key.GVR).Namespace(key.Namespace)
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return resource.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return resource.Watch(ctx, o)
		},
	}
}

// logWatchError logs a failed list or watch as client-go's default handler
// does: an expired watch (410 Gone, after etcd compaction) is routine and
// only relists; anything else is an error worth seeing.
func logWatchError(ctx context.Context, identity string, err error) {
	logger := klog.FromContext(ctx)
	switch {
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err), errors.Is(err, io.EOF):
		logger.V(2).Info("Watch ended; relisting", "err", err)
	case apierrors.IsForbidden(err) && identity != "":
		logger.Error(err, "Not allowed to list or watch: grant the rule's ServiceAccount list and watch on this resource", "serviceAccount", identity)
	case apierrors.IsForbidden(err):
		logger.Error(err, "Not allowed to list or watch: grant syncloop's ServiceAccount list and watch on this resource")
	default:
		logger.Error(err, "List or watch failed; retrying with backoff")
	}
}

func (e *entry) stop() { e.run.Load().stop() }

func (run *informerRun) stop() {
	run.cancel()
	<-run.done
}

// transformFor readies the objects of an informer for the cache: it
// drops metadata.managedFields — syncloop never reads them, and they are
// often the larger part of an object — and interns the strings objects
// repeat.
func (r *Registry) transformFor() cache.TransformFunc {
	return func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		if md, ok := u.Object["metadata"].(map[string]any); ok {
			r.filterManagedFields(md)
		}
		internObject(u.Object)
		return obj, nil
	}
}

// filterManagedFields drops the managedFields entries KeepManagedFields
// does not keep, working on the raw entries: every cached object passes
// here, and most keep none.
func (r *Registry) filterManagedFields(md map[string]any) {
	entries, _ := md["managedFields"].([]any)
	var kept []any
	if r.KeepManagedFields != nil {
		for _, e := range entries {
			if m, ok := e.(map[string]any); ok {
				if manager, _ := m["manager"].(string); r.KeepManagedFields(manager) {
					kept = append(kept, e)
				}
			}
		}
	}
	if kept == nil {
		delete(md, "managedFields")
	} else {
		md["managedFields"] = kept
	}
}

// Len is the number of informers running.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

// Keys returns the WatchKeys of the running informers.
func (r *Registry) Keys() []WatchKey {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]WatchKey, 0, len(r.entries))
	for k := range r.entries {
		keys = append(keys, k)
	}
	return keys
}

// Subscription is one handler on one shared informer.
type Subscription struct {
	r       *Registry
	e       *entry
	handler cache.ResourceEventHandler
	// reg is the handler's registration on the entry's informer; Refresh
	// and Stop change it and the informer under the Registry's mu.
	reg  atomic.Pointer[cache.ResourceEventHandlerRegistration]
	once sync.Once
}

// Key is the informer's WatchKey.
func (s *Subscription) Key() WatchKey { return s.e.key }

// Refresh lists the subscription's informer again (Registry.Refresh).
func (s *Subscription) Refresh(ctx context.Context) error { return s.r.Refresh(ctx, s.e.key) }

// Drop removes from the informer's cache, without a request, every
// object Keep no longer keeps: how an informer with a Filter lets go of
// what its subscribers need no more. It reports how many it removed. No
// handler is told; gone, when not nil, is called with each. What Keep
// keeps now and did not before is not added: that takes Refresh.
func (s *Subscription) Drop(gone func(obj any)) int {
	if s.e.key.Filter == "" || s.r.Keep == nil {
		return 0
	}
	idx := s.Indexer()
	n := 0
	for _, obj := range idx.List() {
		m, err := meta.Accessor(obj)
		if err != nil || s.r.Keep(s.e.key, m) {
			continue
		}
		if idx.Delete(obj) == nil {
			n++
			if gone != nil {
				gone(obj)
			}
		}
	}
	return n
}

func (s *Subscription) registration() cache.ResourceEventHandlerRegistration { return *s.reg.Load() }

// HasSynced reports whether the informer has listed and this handler has
// been sent every object of that list.
func (s *Subscription) HasSynced() bool { return s.registration().HasSynced() }

// Synced is closed once HasSynced: waiting on it needs no polling.
func (s *Subscription) Synced() <-chan struct{} { return s.registration().HasSyncedChecker().Done() }

// WaitForSync blocks until HasSynced or ctx ends; it reports which.
func (s *Subscription) WaitForSync(ctx context.Context) bool {
	return cache.WaitFor(ctx, "", s.registration().HasSyncedChecker())
}

// LastError is the error of the informer's last failed list or watch, or
// nil if none failed. Until HasSynced it says why the cache is not filled:
// missing RBAC, an unreachable API server.
func (s *Subscription) LastError() error {
	if p := s.e.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// LastSyncResourceVersion is the resourceVersion the informer's list or
// watch has come to: every event up to it has been dealt with, those of
// objects a Filter left out among them.
func (s *Subscription) LastSyncResourceVersion() string {
	return s.e.informer().LastSyncResourceVersion()
}

// Indexer is the informer's cache. Callers must not modify what it returns.
func (s *Subscription) Indexer() cache.Indexer { return s.e.informer().GetIndexer() }

// Stop removes the handler (an event being delivered right then may still
// complete; none is delivered after). The last
// subscriber's Stop stops the informer and waits for it to end. Stop may be
// called more than once.
func (s *Subscription) Stop() {
	s.once.Do(func() {
		r := s.r
		r.mu.Lock()
		_ = s.e.informer().RemoveEventHandler(s.registration())
		delete(s.e.subs, s)
		last := len(s.e.subs) == 0
		if last && r.entries[s.e.key] == s.e {
			delete(r.entries, s.e.key)
		}
		r.mu.Unlock()
		if last {
			s.e.stop()
		}
	})
}

// Shutdown stops every informer and waits for them, whatever their
// subscribers. The Registry must not be used afterwards.
func (r *Registry) Shutdown() {
	r.mu.Lock()
	entries := r.entries
	r.entries = map[WatchKey]*entry{}
	r.mu.Unlock()
	for _, e := range entries {
		e.stop()
	}
}
