package dynamic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

	// Identity, when set before the first Subscribe, names who the
	// client's requests act as (a ServiceAccount it impersonates, as
	// namespace/name) in the log of a refused list or watch; "" is
	// syncloop's own.
	Identity string

	mu      sync.Mutex
	entries map[WatchKey]*entry
}

type entry struct {
	key      WatchKey
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	done     chan struct{} // closed when the informer's goroutine has returned
	subs     int
	lastErr  atomic.Pointer[error] // the last failed list or watch
}

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
		var err error
		if e, err = r.start(ctx, key); err != nil {
			return nil, err
		}
		r.entries[key] = e
	}
	reg, err := e.informer.AddEventHandler(handler)
	if err != nil {
		if e.subs == 0 {
			delete(r.entries, key)
			e.stop()
		}
		return nil, fmt.Errorf("subscribing to %s: %w", key, err)
	}
	e.subs++
	return &Subscription{r: r, e: e, reg: reg}, nil
}

func (r *Registry) start(ctx context.Context, key WatchKey) (*entry, error) {
	tweak := func(o *metav1.ListOptions) {
		o.LabelSelector = key.LabelSelector
		o.FieldSelector = key.FieldSelector
	}
	var inf cache.SharedIndexInformer
	if r.Protobuf.serves(ctx, key.GVR) {
		convert := func(obj runtime.Object) (*unstructured.Unstructured, error) {
			return typedToUnstructured(obj, key.GVR.GroupVersion(), r.KeepManagedFields)
		}
		inf = cache.NewSharedIndexInformerWithOptions(r.Protobuf.listWatch(key, tweak, convert, r.jsonListWatch(key, tweak)),
			&unstructured.Unstructured{}, cache.SharedIndexInformerOptions{Indexers: r.indexers, ObjectDescription: key.GVR.String()})
	} else {
		inf = dynamicinformer.NewFilteredDynamicInformer(r.client, key.GVR, key.Namespace, 0, r.indexers, tweak).Informer()
	}
	if err := inf.SetTransform(r.transform); err != nil {
		return nil, err
	}
	ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ictx = klog.NewContext(ictx, klog.FromContext(ctx).WithValues("watch", key.String()))
	e := &entry{key: key, informer: inf, cancel: cancel, done: make(chan struct{})}
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
		defer close(e.done)
		inf.RunWithContext(ictx)
	}()
	return e, nil
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

func (e *entry) stop() {
	e.cancel()
	<-e.done
}

// transform readies an object for the cache: it drops
// metadata.managedFields — syncloop never reads them, and they are often
// the larger part of an object — and interns the strings objects repeat.
func (r *Registry) transform(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		if md, ok := u.Object["metadata"].(map[string]any); ok {
			r.filterManagedFields(md)
		}
		internObject(u.Object)
	}
	return obj, nil
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
	r    *Registry
	e    *entry
	reg  cache.ResourceEventHandlerRegistration
	once sync.Once
}

// Key is the informer's WatchKey.
func (s *Subscription) Key() WatchKey { return s.e.key }

// HasSynced reports whether the informer has listed and this handler has
// been sent every object of that list.
func (s *Subscription) HasSynced() bool { return s.reg.HasSynced() }

// Synced is closed once HasSynced: waiting on it needs no polling.
func (s *Subscription) Synced() <-chan struct{} { return s.reg.HasSyncedChecker().Done() }

// WaitForSync blocks until HasSynced or ctx ends; it reports which.
func (s *Subscription) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), s.reg.HasSynced)
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

// Indexer is the informer's cache. Callers must not modify what it returns.
func (s *Subscription) Indexer() cache.Indexer { return s.e.informer.GetIndexer() }

// Stop removes the handler (an event being delivered right then may still
// complete; none is delivered after). The last
// subscriber's Stop stops the informer and waits for it to end. Stop may be
// called more than once.
func (s *Subscription) Stop() {
	s.once.Do(func() {
		_ = s.e.informer.RemoveEventHandler(s.reg)
		r := s.r
		r.mu.Lock()
		s.e.subs--
		last := s.e.subs == 0
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
