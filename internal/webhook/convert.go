package webhook

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// Metrics counts conversions: each object's result (converted or
// failed), each review's latency, and the reviews refused unread. The
// labels are bounded whoever sends the review: a kind is one syncloop
// converts and a version one of its versions, or else OtherLabel.
type Metrics interface {
	Converted(kind, from, to, result string)
	Reviewed(kind string, d time.Duration)
	// Refused counts a review answered without being converted, for
	// one of Refusals.
	Refused(reason string)
}

// OtherLabel stands, in the metrics, for every kind syncloop does not
// convert and every version that is not one of the kind's.
const OtherLabel = "other"

// Why a review is refused unread (Metrics.Refused).
const (
	// RefusedTooLarge: its body is larger than maxReviewBytes (413), or
	// decoding an object of it would cost more than all reviews may
	// (a failed review).
	RefusedTooLarge = "too-large"
	// RefusedBusy: the reviews in flight leave no room for it (429 and
	// Retry-After, which the API server's client waits and sends again).
	RefusedBusy = "busy"
	// RefusedMalformed: not a ConversionReview (400).
	RefusedMalformed = "malformed"
)

// Refusals are the reasons Metrics.Refused is called with.
var Refusals = []string{RefusedTooLarge, RefusedBusy, RefusedMalformed}

// Converter answers the API server's ConversionReviews (apiextensions.k8s.io/v1)
// with the conversions of the kinds rules define. A kind whose rule is
// removed, or stops loading, keeps the last conversion it had: its
// objects must stay readable.
//
// Whoever reaches it, what it holds is bounded: a review's body by
// maxReviewBytes, the reviews in flight by maxReviews and, together, by
// reviewMemory of what they are charged (bodyCharge, then the decode of
// their largest object) before it is spent.
type Converter struct {
	mu    sync.RWMutex
	kinds map[schema.GroupKind]*rules.API
	gate  *gate
	// Metrics, when set, counts conversions.
	Metrics Metrics
}

// NewConverter converts nothing until Use.
func NewConverter() *Converter {
	return &Converter{kinds: map[schema.GroupKind]*rules.API{}, gate: &gate{maxReviews: maxReviews, budget: reviewMemory}}
}

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

// ServeHTTP answers one ConversionReview. A body larger than
// maxReviewBytes is refused unread (413 Request Entity Too Large); a
// review that does not fit among those in flight is refused at once
// (429 Too Many Requests, Retry-After: 1 — the API server's client
// waits and sends it again, within its 30 s for the call).
func (c *Converter) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		http.Error(w, "POST a ConversionReview", http.StatusMethodNotAllowed)
		return
	}
	if req.ContentLength > maxReviewBytes {
		c.refuse(w, RefusedTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("a ConversionReview is at most %d bytes, not %d", maxReviewBytes, req.ContentLength))
		return
	}
	size := req.ContentLength
	if size < 0 {
		size = maxReviewBytes
	}
	t, ok := c.gate.enter(bodyCharge(size))
	if !ok {
		c.busy(w)
		return
	}
	defer t.leave()
	r, err := readReview(w, req, size)
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		c.refuse(w, RefusedTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("a ConversionReview is at most %d bytes", maxReviewBytes))
		return
	case err != nil:
		c.refuse(w, RefusedMalformed, http.StatusBadRequest, err.Error())
		return
	}
	a := c.review(req.Context(), r.Request, t)
	if a.busy {
		c.busy(w)
		return
	}
	if err := a.write(w); err != nil {
		klog.FromContext(req.Context()).Error(err, "Writing a ConversionReview")
	}
}

// readReview reads a review's body of size bytes (its Content-Length),
// or of at most maxReviewBytes when its length is not said (size is
// then that), and decodes its envelope: what is returned holds the
// objects, not the body.
func readReview(w http.ResponseWriter, req *http.Request, size int64) (*envelope, error) {
	var body []byte
	var err error
	if req.ContentLength < 0 {
		body, err = io.ReadAll(http.MaxBytesReader(w, req.Body, size))
	} else {
		body = make([]byte, size)
		_, err = io.ReadFull(req.Body, body)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the ConversionReview: %w", err)
	}
	return decodeEnvelope(body)
}

func (c *Converter) busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	c.refuse(w, RefusedBusy, http.StatusTooManyRequests, "too many conversions in flight: retry")
}

func (c *Converter) refuse(w http.ResponseWriter, reason string, code int, msg string) {
	if c.Metrics != nil {
		c.Metrics.Refused(reason)
	}
	http.Error(w, msg, code)
}
