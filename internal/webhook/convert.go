package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// Metrics counts conversions: each object's result (converted or
// failed), and each review's latency.
type Metrics interface {
	Converted(kind, from, to, result string)
	Reviewed(kind string, d time.Duration)
}

// Converter answers the API server's ConversionReviews (apiextensions.k8s.io/v1)
// with the conversions of the kinds rules define. A kind whose rule is
// removed, or stops loading, keeps the last conversion it had: its
// objects must stay readable.
type Converter struct {
	mu    sync.RWMutex
	kinds map[schema.GroupKind]*rules.API
	// Metrics, when set, counts conversions.
	Metrics Metrics
}

// maxReview bounds the body of a review read (the API server sends at
// most a list's page of objects, bounded by its own request limit).
const maxReview = 64 << 20

// NewConverter converts nothing until Use.
func NewConverter() *Converter { return &Converter{kinds: map[schema.GroupKind]*rules.API{}} }

// Use converts the kinds of set's rules from now on as set's rules say;
// other kinds keep the conversion they had.
func (c *Converter) Use(set *rules.Set) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range set.Rules() {
		if r.API != nil && r.API.Converts() {
			c.kinds[r.API.GVK.GroupKind()] = r.API
		}
	}
}

// Keep converts a's kind as a says unless a kind of the rules used
// already converts it: a is the conversion a CRD kept of a rule no longer
// loaded.
func (c *Converter) Keep(a *rules.API) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.kinds[a.GVK.GroupKind()]; ok {
		return false
	}
	c.kinds[a.GVK.GroupKind()] = a
	return true
}

// Kinds is how many kinds it converts.
func (c *Converter) Kinds() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.kinds)
}

func (c *Converter) api(gk schema.GroupKind) *rules.API {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.kinds[gk]
}

// ServeHTTP answers one ConversionReview.
func (c *Converter) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		http.Error(w, "POST a ConversionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxReview))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var review apiextv1.ConversionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not a ConversionReview: %v", err), http.StatusBadRequest)
		return
	}
	review.Response = c.Review(req.Context(), review.Request)
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&review); err != nil {
		klog.FromContext(req.Context()).Error(err, "Writing a ConversionReview")
	}
}

// Review converts the objects of one request; a failure of any fails
// the whole, as the API server expects.
func (c *Converter) Review(ctx context.Context, req *apiextv1.ConversionRequest) *apiextv1.ConversionResponse {
	start := time.Now()
	resp := &apiextv1.ConversionResponse{UID: req.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	kind := ""
	defer func() {
		if c.Metrics != nil && kind != "" {
			c.Metrics.Reviewed(kind, time.Since(start))
		}
	}()
	to, err := schema.ParseGroupVersion(req.DesiredAPIVersion)
	if err != nil {
		return failed(resp, fmt.Errorf("desiredAPIVersion %q: %w", req.DesiredAPIVersion, err))
	}
	for _, raw := range req.Objects {
		var obj map[string]any
		if err := json.Unmarshal(raw.Raw, &obj); err != nil {
			return failed(resp, fmt.Errorf("an object does not decode: %w", err))
		}
		apiVersion, _ := obj["apiVersion"].(string)
		k, _ := obj["kind"].(string)
		kind = k
		from, _ := schema.ParseGroupVersion(apiVersion)
		out, err := c.convert(ctx, obj, from, to, k)
		if c.Metrics != nil {
			c.Metrics.Converted(k, from.Version, to.Version, result(err))
		}
		if err != nil {
			return failed(resp, err)
		}
		data, err := json.Marshal(out)
		if err != nil {
			return failed(resp, err)
		}
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: data})
	}
	return resp
}

// convert converts one object, a panic contained as its error.
func (c *Converter) convert(ctx context.Context, obj map[string]any, from, to schema.GroupVersion, kind string) (out map[string]any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("converting %s: panic: %v", kind, p)
			klog.FromContext(ctx).Error(err, "Conversion panicked")
		}
	}()
	if from.Group != to.Group {
		return nil, fmt.Errorf("%s/%s cannot become a %s object", from, kind, to)
	}
	a := c.api(schema.GroupKind{Group: from.Group, Kind: kind})
	if a == nil {
		return nil, fmt.Errorf("syncloop converts no %s.%s: no rule defines it in versions", kind, from.Group)
	}
	return a.Convert(ctx, obj, to.Version)
}

func result(err error) string {
	if err != nil {
		return "failed"
	}
	return "converted"
}

func failed(resp *apiextv1.ConversionResponse, err error) *apiextv1.ConversionResponse {
	resp.ConvertedObjects = nil
	resp.Result = metav1.Status{Status: metav1.StatusFailure, Message: strings.TrimSpace(err.Error())}
	return resp
}
