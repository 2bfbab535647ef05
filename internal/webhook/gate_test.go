package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// counting is a body that counts the bytes read of it.
type counting struct {
	r io.Reader
	n atomic.Int64
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// zeros is an endless body.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

const alphaApp = `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":2,"image":"nginx:1.29"}}`

// TestReviewBodyLimit: a review larger than the limit is refused 413 —
// unread when its Content-Length says so, after at most the limit when
// it says nothing — and one that says less than it sends is read no
// further than it says; a review at the limit is served.
func TestReviewBodyLimit(t *testing.T) {
	c := NewConverter()
	s := newSeries()
	c.Metrics = s
	c.Use(versionsSet(t))
	const limit = 16 << 20
	serve := func(body io.Reader, length int64) (*httptest.ResponseRecorder, int64) {
		b := &counting{r: body}
		req := httptest.NewRequest(http.MethodPost, "/convert", b)
		req.ContentLength = length
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		return rec, b.n.Load()
	}
	if rec, read := serve(zeros{}, limit+1); rec.Code != http.StatusRequestEntityTooLarge || read != 0 {
		t.Errorf("Content-Length over the limit: %d after reading %d bytes, want 413 unread", rec.Code, read)
	}
	if rec, read := serve(zeros{}, -1); rec.Code != http.StatusRequestEntityTooLarge || read > limit+1 {
		t.Errorf("an endless body of no length: %d after reading %d bytes, want 413 within the limit", rec.Code, read)
	}
	body := reviewBody("example.syncloop.dev/v1", alphaApp)
	if rec, read := serve(io.MultiReader(bytes.NewReader(body), zeros{}), int64(len(body))); rec.Code != http.StatusOK || read != int64(len(body)) {
		t.Errorf("a body longer than its Content-Length: %d after reading %d bytes, want 200 after %d", rec.Code, read, len(body))
	}
	padded := append(reviewBody("example.syncloop.dev/v1", alphaApp), bytes.Repeat([]byte(" "), limit-len(body))...)
	if rec, _ := serve(bytes.NewReader(padded), int64(len(padded))); rec.Code != http.StatusOK {
		t.Errorf("a review of the limit's size: %d %.200s, want it served", rec.Code, rec.Body)
	}
	if s.refused["too-large"] != 2 {
		t.Errorf("refusals counted %v, want 2 too-large", s.refused)
	}
}

// held are reviews in flight, each blocked reading its body until
// released.
type held struct {
	started sync.WaitGroup
	writers []*io.PipeWriter
	done    sync.WaitGroup
}

// hold starts n reviews of c that each say they are length bytes long
// and wait, mid-body, to be released.
func hold(c http.Handler, n int, length int64) *held {
	h := &held{}
	for range n {
		r, w := io.Pipe()
		h.writers = append(h.writers, w)
		h.started.Add(1)
		h.done.Add(1)
		var once sync.Once
		go func() {
			defer h.done.Done()
			req := httptest.NewRequest(http.MethodPost, "/convert", &signal{r: r, first: func() { once.Do(h.started.Done) }})
			req.ContentLength = length
			rec := httptest.NewRecorder()
			c.ServeHTTP(rec, req)
			once.Do(h.started.Done) // refused unread
		}()
	}
	return h
}

// release lets every held review end.
func (h *held) release() {
	for _, w := range h.writers {
		w.CloseWithError(io.ErrUnexpectedEOF)
	}
	h.done.Wait()
}

// signal is a body that says when it is first read.
type signal struct {
	r     io.Reader
	first func()
}

func (s *signal) Read(p []byte) (int, error) { s.first(); return s.r.Read(p) }

// TestReviewsInFlightBounded: beyond the reviews a replica serves at
// once, or beyond what they may hold together, a review is answered at
// once 429 with Retry-After, never queued; once they end, it is served.
func TestReviewsInFlightBounded(t *testing.T) {
	body := reviewBody("example.syncloop.dev/v1", alphaApp)
	for name, tc := range map[string]struct {
		n      int
		length int64
		small  bool // a small review still fits
	}{
		"32 reviews in flight":            {n: 32, length: int64(len(body))},
		"one of 16 MiB holding its share": {n: 1, length: 16 << 20, small: true},
	} {
		t.Run(name, func(t *testing.T) {
			c := NewConverter()
			s := newSeries()
			c.Metrics = s
			c.Use(versionsSet(t))
			h := hold(c, tc.n, tc.length)
			defer h.release()
			h.started.Wait()
			big := append(reviewBody("example.syncloop.dev/v1", alphaApp), bytes.Repeat([]byte(" "), int(tc.length)-len(body))...)
			rec := post(c, big)
			if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
				t.Fatalf("with %d held: %d, Retry-After %q; want 429 and Retry-After: 1", tc.n, rec.Code, rec.Header().Get("Retry-After"))
			}
			if small := post(c, body); tc.small != (small.Code == http.StatusOK) {
				t.Errorf("a small review beside them: %d, want served %v", small.Code, tc.small)
			}
			h.release()
			if rec := post(c, big); rec.Code != http.StatusOK {
				t.Errorf("once they ended: %d, want served", rec.Code)
			}
			if s.refused["busy"] < 1 {
				t.Errorf("refusals counted %v, want busy", s.refused)
			}
		})
	}
}

// TestReviewLargeObjectConverted: an object as large as the API server
// stores (1.5 MiB, many small fields) is converted: the bounds refuse
// what costs more than that, not it.
func TestReviewLargeObjectConverted(t *testing.T) {
	c := NewConverter()
	c.Use(versionsSet(t))
	var labels strings.Builder
	for i := 0; labels.Len() < 3<<19; i++ {
		if i > 0 {
			labels.WriteString(",")
		}
		labels.WriteString(`"app.example.com/l` + strings.Repeat("x", i%20) + string(rune('a'+i%26)) + `":"v"`)
		labels.WriteString(`,"k` + string(rune('a'+i%26)) + "-" + strings.Repeat("y", i%7) + `":"w"`)
	}
	obj := `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a","labels":{` + labels.String() + `}},"spec":{"size":2,"image":"nginx:1.29"}}`
	r := review(t, c, "example.syncloop.dev/v1", obj)
	if r.Result.Status != metav1.StatusSuccess || len(r.ConvertedObjects) != 1 {
		t.Errorf("an object of %d KiB: %+v", len(obj)>>10, r.Result)
	}
}

// TestReviewBusyRetried: the 429 a full webhook answers makes client-go's
// REST client — the API server's client of conversion webhooks — wait
// its Retry-After and send the review again; served then, it succeeds.
func TestReviewBusyRetried(t *testing.T) {
	c := NewConverter()
	c.Use(versionsSet(t))
	h := hold(c, 32, 1<<10)
	defer h.release()
	h.started.Wait()
	var requests, refused atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		rec := &status{ResponseWriter: w}
		c.ServeHTTP(rec, r)
		if rec.code == http.StatusTooManyRequests && refused.Add(1) == 1 {
			h.release() // before the 429 is sent: the retry finds room
		}
	}))
	defer srv.Close()
	client, err := rest.RESTClientFor(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
		GroupVersion: &apiextv1.SchemeGroupVersion, NegotiatedSerializer: serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	data, err := client.Post().AbsPath("/convert").SetHeader("Content-Type", "application/json").Body(reviewBody("example.syncloop.dev/v1", alphaApp)).Do(ctx).Raw()
	if err != nil {
		t.Fatalf("the review through client-go: %v", err)
	}
	var out apiextv1.ConversionReview
	if err := json.Unmarshal(data, &out); err != nil || out.Response == nil || out.Response.Result.Status != metav1.StatusSuccess {
		t.Fatalf("answer %s: %v", data, err)
	}
	if requests.Load() != 2 || refused.Load() != 1 {
		t.Errorf("%d requests, %d refused: want the review refused once and sent again", requests.Load(), refused.Load())
	}
}

// status records the status code a handler answers.
type status struct {
	http.ResponseWriter
	code int
}

func (s *status) WriteHeader(code int) { s.code = code; s.ResponseWriter.WriteHeader(code) }
