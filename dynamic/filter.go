package dynamic

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// keepFilter leaves out of an informer's lists and watches the objects
// the Registry's Keep does not keep (WatchKey.Filter), so that its cache
// never holds them: they are dropped as they are decoded.
//
// A list keeps what Keep keeps. A watch event of an object not kept is
// sent on as:
//   - nothing, when it is an Added: the cache does not hold a new object;
//   - a Deleted, when the cache holds the object (Keep kept it before):
//     the informer's handlers are told it is gone from the cache;
//   - a Bookmark at its resourceVersion otherwise, so that the informer's
//     watch resumes after it, not before, when it reconnects.
type keepFilter struct {
	key        WatchKey
	keep       func(WatchKey, metav1.Object) bool
	apiVersion string // of the bookmarks it makes
	// cache is the informer's, set before it runs.
	cache cache.Indexer
	// example, when set, makes the empty object of the informer's type,
	// for its bookmarks: the informer caches typed objects (cached.go).
	example func() runtime.Object
}

func newKeepFilter(key WatchKey, keep func(WatchKey, metav1.Object) bool) *keepFilter {
	return &keepFilter{key: key, keep: keep, apiVersion: key.GVR.GroupVersion().String()}
}

// keeps reports whether obj is to be cached.
func (f *keepFilter) keeps(obj runtime.Object) bool {
	if f == nil {
		return true
	}
	m, err := meta.Accessor(obj)
	return err != nil || f.keep(f.key, m)
}

// instead is the event sent in place of ev, whose object Keep does not
// keep, and false for none; whole makes of ev's object the one the
// informer caches (for a Deleted, the last state its handlers are sent).
// An error is sent as the event that ends the watch.
func (f *keepFilter) instead(ev watch.Event, whole func(runtime.Object) (runtime.Object, error)) (watch.Event, bool) {
	if ev.Type != watch.Modified && ev.Type != watch.Deleted {
		return watch.Event{}, false
	}
	m, err := meta.Accessor(ev.Object)
	if err != nil {
		return errorEvent(err), true
	}
	key := m.GetName()
	if ns := m.GetNamespace(); ns != "" {
		key = ns + "/" + key
	}
	if _, cached, _ := f.cache.GetByKey(key); cached {
		obj, err := whole(ev.Object)
		if err != nil {
			return errorEvent(err), true
		}
		return watch.Event{Type: watch.Deleted, Object: obj}, true
	}
	if f.example != nil {
		bm := f.example()
		bmm, err := meta.Accessor(bm)
		if err != nil {
			return errorEvent(err), true
		}
		bmm.SetResourceVersion(m.GetResourceVersion())
		return watch.Event{Type: watch.Bookmark, Object: bm}, true
	}
	bm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": f.apiVersion,
		"metadata":   map[string]any{"resourceVersion": m.GetResourceVersion()},
	}}
	return watch.Event{Type: watch.Bookmark, Object: bm}, true
}

// asDecoded is an object as the dynamic client decoded it: cached as is.
func asDecoded(obj runtime.Object) (runtime.Object, error) { return obj, nil }

// listWatch is lw, the dynamic client's, with f's filter.
func (f *keepFilter) listWatch(lw *cache.ListWatch) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := lw.ListWithContextFunc(ctx, o)
			if err != nil {
				return nil, err
			}
			if l, ok := obj.(*unstructured.UnstructuredList); ok {
				kept := l.Items[:0]
				for i := range l.Items {
					if f.keeps(&l.Items[i]) {
						kept = append(kept, l.Items[i])
					}
				}
				clear(l.Items[len(kept):])
				l.Items = kept
			}
			return obj, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := lw.WatchFuncWithContext(ctx, o)
			if err != nil {
				return nil, err
			}
			return newConvertingWatch(w, func(ev watch.Event) (watch.Event, bool) {
				if ev.Type == watch.Error || ev.Type == watch.Bookmark || f.keeps(ev.Object) {
					return ev, true
				}
				return f.instead(ev, asDecoded)
			}), nil
		},
	}
}
