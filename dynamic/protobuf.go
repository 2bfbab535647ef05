package dynamic

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Protobuf lists and watches the kinds client-go has types for — the
// built-in ones — in the API server's protobuf encoding, and hands the
// informers the same unstructured objects the dynamic client's JSON would
// have made.
//
// Why: decoding JSON into unstructured maps is most of what an informer
// costs a controller (the watch event's envelope, the object's kind and the
// object itself are each scanned), while protobuf decodes in one pass into
// the typed object, whose conversion to a map is cheaper still than the
// JSON (measured in dynamic's BenchmarkDecode). Custom resources have no
// protobuf encoding; they stay JSON.
//
// It is lossless where it is used: the API server stores built-in objects
// as protobuf, so its JSON holds nothing the protobuf does not — except
// fields the types compiled into syncloop do not know, from an API server
// newer than them. Protobuf is therefore used only while the API server's
// version is not newer than client-go's types (checked once, from
// /version); otherwise every kind stays JSON.
type Protobuf struct {
	rest    rest.Interface
	dynREST rest.Interface // the JSON client, for /version

	mu     sync.Mutex           // one /version request at a time
	usable atomic.Pointer[bool] // nil until the server's version is known

	// jsonOnly holds the resources whose answers were not a type of
	// client-go's (a resource of a built-in group served by an extension):
	// they go back to JSON.
	jsonOnly sync.Map // schema.GroupVersionResource → true
}

func newProtobuf(cfg *rest.Config, httpClient *http.Client, dynREST rest.Interface) (*Protobuf, error) {
	pc := rest.CopyConfig(cfg)
	pc.ContentType = runtime.ContentTypeProtobuf
	pc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	pc.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	pc.GroupVersion = nil
	pc.APIPath = "/if-you-see-this-search-for-the-break"
	// Its requests count against the JSON client's token bucket (with
	// --qps): applies go through either.
	pc.RateLimiter = dynREST.GetRateLimiter()
	rc, err := rest.UnversionedRESTClientForConfigAndClient(pc, httpClient)
	if err != nil {
		return nil, err
	}
	return &Protobuf{rest: rc, dynREST: dynREST}, nil
}

// serves reports whether gvr is listed and watched in protobuf: a kind of
// client-go's, from an API server not newer than its types.
func (p *Protobuf) serves(ctx context.Context, gvr schema.GroupVersionResource) bool {
	if p == nil || !scheme.Scheme.IsVersionRegistered(gvr.GroupVersion()) {
		return false
	}
	if _, ok := p.jsonOnly.Load(gvr); ok {
		return false
	}
	if usable := p.usable.Load(); usable != nil {
		return *usable
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if usable := p.usable.Load(); usable != nil {
		return *usable
	}
	server, err := p.serverVersion(ctx)
	if err != nil {
		return false // JSON this time; asked again for the next informer
	}
	ok := typesKnowServer(server, typesMinor)
	p.usable.Store(&ok)
	return ok
}

func (p *Protobuf) serverVersion(ctx context.Context) (*version.Info, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := p.dynREST.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// typesMinor is the Kubernetes minor version of the API types compiled in:
// k8s.io/api v0.M.x is Kubernetes 1.M (a test holds it to go.mod).
const typesMinor = 37

// typesKnowServer reports whether types of Kubernetes 1.typesMinor know
// every field the API server of version server can send: it is no newer.
func typesKnowServer(server *version.Info, typesMinor int) bool {
	if server == nil || typesMinor == 0 || server.Major != "1" {
		return false
	}
	minor, err := strconv.Atoi(strings.TrimRight(server.Minor, "+"))
	return err == nil && minor <= typesMinor
}

// listWatch is the ListerWatcher of an informer on key in protobuf, whose
// objects are made what the cache holds by convert (unstructured, or
// typed readied for the cache) once filter (nil: none) keeps them; jsonLW
// is used instead once the resource turns out not to be client-go's.
func (p *Protobuf) listWatch(key WatchKey, tweak func(*metav1.ListOptions), convert func(runtime.Object) (runtime.Object, error), filter *keepFilter, jsonLW *cache.ListWatch) cache.ListerWatcher {
	resource := func() *rest.Request {
		return p.rest.Get().AbsPath(collectionPath(key.GVR, key.Namespace)...)
	}
	_, typed := typedCached[key.GVR]
	var fallenBack atomic.Bool
	fallBack := func(err error) error {
		p.jsonOnly.Store(key.GVR, true)
		fallenBack.Store(true)
		return fmt.Errorf("%s is not a type of client-go's, listing it as JSON from now on: %w", key.GVR, err)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if fallenBack.Load() {
				return jsonLW.ListWithContextFunc(ctx, o)
			}
			tweak(&o)
			obj, err := resource().SpecificallyVersionedParams(&o, parameterCodec, optionsVersion).Do(ctx).Get()
			if err != nil {
				if runtime.IsNotRegisteredError(err) {
					return nil, fallBack(err)
				}
				return nil, err
			}
			return cacheList(obj, typed, filter.keeps, convert)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if fallenBack.Load() {
				return jsonLW.WatchFuncWithContext(ctx, o)
			}
			tweak(&o)
			o.Watch = true
			w, err := resource().SpecificallyVersionedParams(&o, parameterCodec, optionsVersion).Watch(ctx)
			if err != nil {
				return nil, err
			}
			return newConvertingWatch(w, func(ev watch.Event) (watch.Event, bool) {
				if ev.Type == watch.Error {
					return ev, true // a Status
				}
				if ev.Type != watch.Bookmark && !filter.keeps(ev.Object) {
					return filter.instead(ev, convert)
				}
				u, err := convert(ev.Object)
				if err != nil {
					return errorEvent(err), true
				}
				return watch.Event{Type: ev.Type, Object: u}, true
			}), nil
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, p.rest)
}

// errorEvent is the watch event that ends a watch with err.
func errorEvent(err error) watch.Event {
	return watch.Event{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure,
		Message: err.Error(), Reason: metav1.StatusReasonInternalError, Code: http.StatusInternalServerError}}
}

// convertingWatch passes a watch's events through convert, which may
// leave one out (false). (apimachinery's
// watch.Filter would do, but its goroutine blocks for ever on an event
// nobody reads once the watch is stopped: one goroutine leaked per
// informer stopped while events came.)
type convertingWatch struct {
	in      watch.Interface
	out     chan watch.Event
	stopped chan struct{}
	once    sync.Once
}

func newConvertingWatch(in watch.Interface, convert func(watch.Event) (watch.Event, bool)) *convertingWatch {
	w := &convertingWatch{in: in, out: make(chan watch.Event), stopped: make(chan struct{})}
	go func() {
		defer close(w.out)
		for ev := range in.ResultChan() {
			out, send := convert(ev)
			if !send {
				continue
			}
			select {
			case w.out <- out:
			case <-w.stopped:
				return
			}
		}
	}()
	return w
}

func (w *convertingWatch) ResultChan() <-chan watch.Event { return w.out }

// Stop stops the watch beneath; ResultChan is closed after.
func (w *convertingWatch) Stop() {
	w.once.Do(func() {
		close(w.stopped)
		w.in.Stop()
	})
}

// cacheList is the list an informer caches of a typed list: the items keep
// keeps, converted — the typed list itself when its kind is cached typed
// (convert readies the items in place), else an UnstructuredList — with
// the list's resourceVersion and continue token.
func cacheList(obj runtime.Object, typed bool, keep func(runtime.Object) bool, convert func(runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	lm, err := meta.ListAccessor(obj)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return nil, err
	}
	kept := make([]runtime.Object, 0, len(items))
	for _, item := range items {
		if !keep(item) {
			continue
		}
		c, err := convert(item)
		if err != nil {
			return nil, err
		}
		kept = append(kept, c)
	}
	if typed {
		if len(kept) < len(items) {
			if err := meta.SetList(obj, kept); err != nil {
				return nil, err
			}
		}
		return obj, nil
	}
	out := &unstructured.UnstructuredList{Object: map[string]any{}, Items: make([]unstructured.Unstructured, 0, len(kept))}
	out.SetResourceVersion(lm.GetResourceVersion())
	out.SetContinue(lm.GetContinue())
	if n := lm.GetRemainingItemCount(); n != nil {
		out.SetRemainingItemCount(n)
	}
	for _, c := range kept {
		out.Items = append(out.Items, *c.(*unstructured.Unstructured))
	}
	return out, nil
}

// typedToUnstructured converts a typed object to the unstructured one its
// JSON would decode to, with apiVersion and kind (protobuf leaves them
// out; gv is the version it was read in), after keep has chosen the
// managedFields entries it holds.
func typedToUnstructured(obj runtime.Object, gv schema.GroupVersion, keep func(manager string) bool) (*unstructured.Unstructured, error) {
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		return nil, err
	}
	gvk := gvks[0]
	for _, k := range gvks { // a type registered in more than one version
		if k.GroupVersion() == gv {
			gvk = k
		}
	}
	if m, err := meta.Accessor(obj); err == nil {
		if mf := m.GetManagedFields(); len(mf) > 0 {
			m.SetManagedFields(keptManagedFields(mf, keep))
		}
	}
	content, err := typedContent(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// collectionPath is the URL path of gvr's collection in namespace ("":
// all namespaces, or a cluster-scoped resource).
func collectionPath(gvr schema.GroupVersionResource, namespace string) []string {
	p := []string{"api"}
	if gvr.Group != "" {
		p = []string{"apis", gvr.Group}
	}
	p = append(p, gvr.Version)
	if namespace != "" {
		p = append(p, "namespaces", namespace)
	}
	return append(p, gvr.Resource)
}
