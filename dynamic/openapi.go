package dynamic

import (
	"context"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/openapi"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// OpenAPI reads the OpenAPI v3 documents the API server serves, one
// group-version at a time, for the schemas of kinds syncloop does not
// have compiled in (custom resources).
type OpenAPI struct {
	client openapi.Client
}

// NewOpenAPI returns an OpenAPI over a discovery client.
func NewOpenAPI(dc discovery.DiscoveryInterface) *OpenAPI {
	return &OpenAPI{client: dc.OpenAPIV3()}
}

// Document returns gv's OpenAPI v3 document as JSON, or nil when the
// server serves none for it, and its tag: the document's URL, which holds
// a hash of its content ("" when none is served).
func (o *OpenAPI) Document(gv schema.GroupVersion) ([]byte, string, error) {
	paths, err := o.client.Paths()
	if err != nil {
		return nil, "", err
	}
	c, ok := paths[openAPIPath(gv)]
	if !ok {
		return nil, "", nil
	}
	data, err := c.Schema(runtime.ContentTypeJSON)
	return data, c.ServerRelativeURL(), err
}

// Tags are the tags (see Document) of the documents the server serves now
// for the group-versions of group.
func (o *OpenAPI) Tags(group string) (map[schema.GroupVersion]string, error) {
	paths, err := o.client.Paths()
	if err != nil {
		return nil, err
	}
	tags := map[schema.GroupVersion]string{}
	for p, c := range paths {
		if g, v, ok := strings.Cut(strings.TrimPrefix(p, "apis/"), "/"); ok && strings.HasPrefix(p, "apis/") && g == group {
			tags[schema.GroupVersion{Group: g, Version: v}] = c.ServerRelativeURL()
		}
	}
	return tags, nil
}

func openAPIPath(gv schema.GroupVersion) string {
	if gv.Group == "" {
		return "api/" + gv.Version
	}
	return "apis/" + gv.Group + "/" + gv.Version
}

// runUnlessForbidden runs inf until ctx ends, or until a list or watch
// is refused (RBAC): that is logged once, as msg, and the informer
// stopped. The context it returns ends with the informer.
func runUnlessForbidden(ctx context.Context, inf cache.SharedIndexInformer, msg string) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	var once sync.Once
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			once.Do(func() {
				klog.FromContext(ctx).Error(err, msg)
				cancel()
			})
			return
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	go inf.RunWithContext(ctx)
	return ctx
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// WatchCRDs watches CustomResourceDefinitions (their metadata only: the
// schemas are read through OpenAPI) and, once the initial list is in,
// calls onChange with the group of each CRD created, deleted or whose spec
// changed (metadata.generation); initial is true for the CRDs of the
// initial list. It returns true once the initial list is in, false when it
// could not be listed (RBAC: then nothing is watched) or did not come
// within syncWait (an unreachable API server must not hold up the start:
// the watch goes on). The watch runs until ctx ends.
func WatchCRDs(ctx context.Context, client metadata.Interface, syncWait time.Duration, onChange func(group string, initial bool)) bool {
	logger := klog.FromContext(ctx)
	inf := metadatainformer.NewFilteredMetadataInformer(client, crdGVR, "", 0, cache.Indexers{}, nil).Informer()
	group := func(obj any) string {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return ""
		}
		// A CRD is named <plural>.<group>.
		_, g, _ := strings.Cut(m.Name, ".")
		return g
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) { onChange(group(obj), initial) },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*metav1.PartialObjectMetadata)
			c, ok2 := cur.(*metav1.PartialObjectMetadata)
			if ok1 && ok2 && o.Generation != c.Generation {
				onChange(group(cur), false)
			}
		},
		DeleteFunc: func(obj any) { onChange(group(obj), false) },
	})
	if err != nil {
		logger.Error(err, "Cannot watch CustomResourceDefinitions: rules are not checked again when one changes")
		return false
	}
	ctx = runUnlessForbidden(ctx, inf, "Not allowed to list and watch CustomResourceDefinitions: rules are not checked again when one changes")
	syncCtx, stop := context.WithTimeout(ctx, syncWait)
	defer stop()
	// Waited for on the handler's channel, not polled: WaitForCacheSync
	// looks every 100 ms, a tenth of a second of every start when the
	// list takes a few.
	return cache.WaitFor(syncCtx, "", reg.HasSyncedChecker())
}
