package dynamic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// TestBoundedRequests: a peer that hangs, trickles or answers without
// end is cut off: a request other than a watch ends at its deadline, its
// answer read whole within its size; a JSON watch's event within its
// size. Each failure is one that found no answer (NoAnswer), so that the
// cluster is set aside; an answer within the bounds passes whole.
func TestBoundedRequests(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/hang":
			<-release
		case r.URL.Path == "/trickle": // headers at once, then the body a byte at a time
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			for range 100 {
				select {
				case <-release:
					return
				case <-time.After(100 * time.Millisecond):
				}
				_, _ = w.Write([]byte("x"))
				w.(http.Flusher).Flush()
			}
		case r.URL.Path == "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 2048)))
		case r.URL.Path == "/exact":
			_, _ = w.Write([]byte(strings.Repeat("x", 1024)))
		case r.URL.Query().Get("watch") == "true":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"type":"ADDED"}` + "\n" + `{"type":"ADDED","object":"` + strings.Repeat("x", 600) + `"}` + "\n"))
		}
	}))
	defer srv.Close()
	defer close(release) // before Close, which waits for the handlers
	cfg := &rest.Config{Host: srv.URL}
	Bound(cfg, Bounds{Timeout: 300 * time.Millisecond, MaxAnswer: 1024, MaxEvent: 512})
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) ([]byte, error) {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+path, nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return io.ReadAll(resp.Body)
	}
	for path, want := range map[string]error{"/hang": context.DeadlineExceeded, "/trickle": context.DeadlineExceeded, "/big": ErrTooLarge, "/x?watch=true": ErrTooLarge} {
		_, err := get(path)
		if !errors.Is(err, want) || !NoAnswer(err) {
			t.Errorf("%s: %v, want %v, as no answer", path, err, want)
		}
	}
	if body, err := get("/exact"); err != nil || len(body) != 1024 {
		t.Errorf("an answer of exactly the bound: %d bytes, %v", len(body), err)
	}
}

// FuzzEventBound: whatever a remote watch stream of JSON objects holds,
// eventBound passes it through unchanged while no object — whatever its
// lines — is longer than its bound, and fails it once one is.
func FuzzEventBound(f *testing.F) {
	f.Add([]byte("{\"type\":\"ADDED\"}\n{}\n"), 8)
	f.Add([]byte("{\"a\":\n\"b\\\"}\",\n\"c\":[1,\n2]}"), 10)
	f.Fuzz(func(t *testing.T, stream []byte, bound int) {
		if bound <= 0 || bound > 1<<20 {
			return
		}
		longest, ok := objectSizes(stream)
		if !ok {
			return // not a stream of objects: client-go fails it anyway
		}
		got, err := io.ReadAll(&eventBound{r: io.NopCloser(strings.NewReader(string(stream))), max: int64(bound)})
		if longest > bound {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("an object of %d bytes passed a bound of %d: %v", longest, bound, err)
			}
			return
		}
		if err != nil || string(got) != string(stream) {
			t.Fatalf("a stream within the bound came out %q, %v", got, err)
		}
	})
}

// objectSizes is the longest JSON object of stream, as encoding/json
// reads it; false unless stream is JSON objects alone.
func objectSizes(stream []byte) (int, bool) {
	dec := json.NewDecoder(bytes.NewReader(stream))
	longest := 0
	for {
		start := int(dec.InputOffset())
		for start < len(stream) && strings.ContainsRune(" \t\r\n", rune(stream[start])) {
			start++
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err == io.EOF {
			return longest, true
		} else if err != nil || len(v) == 0 || v[0] != '{' {
			return 0, false
		}
		longest = max(longest, int(dec.InputOffset())-start)
	}
}

// TestEventBoundSpansLines: one event of many short lines is bounded
// whole, and so is one whose Content-Type does not say JSON: client-go
// decodes it as JSON all the same.
func TestEventBoundSpansLines(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","resourceVersion":"2"},"data":{`)
	for i := range 20000 {
		if i > 0 {
			b.WriteString(",\n")
		}
		fmt.Fprintf(&b, `"k%07d":"%s"`, i, strings.Repeat("v", 100))
	}
	b.WriteString("}}}\n")
	for _, contentType := range []string{"application/json", "", "application/json; charset"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = []string{contentType}
			_, _ = io.WriteString(w, b.String())
		}))
		cfg := &rest.Config{Host: srv.URL}
		Bound(cfg, Bounds{MaxEvent: 1 << 20})
		c, err := NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		w, err := c.Dynamic.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Watch(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ev := <-w.ResultChan()
		if ev.Type != watch.Error {
			t.Errorf("Content-Type %q: an event of %d bytes in lines of 110 passed a bound of 1 MiB as %s", contentType, b.Len(), ev.Type)
		}
		w.Stop()
		srv.Close()
	}
}

// TestOneHop: a remote API server's redirect is refused, never followed
// (the credentials would go where it says, plain http included), and its
// Retry-After is not waited out: one request, one round trip.
func TestOneHop(t *testing.T) {
	var elsewhere, asked atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if strings.HasSuffix(r.URL.Path, "/moved") {
			http.Redirect(w, r, other.URL+"/latest/meta-data", http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Retry-After", "2147483647")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":429}`)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, BearerToken: "t0ken"}
	Bound(cfg, Bounds{Timeout: 5 * time.Second})
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cms := c.Dynamic.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("d")
	if _, err := cms.Get(t.Context(), "moved", metav1.GetOptions{}); err == nil || elsewhere.Load() != 0 {
		t.Errorf("a redirect: %v, %d requests where it pointed; want refused, none", err, elsewhere.Load())
	}
	asked.Store(0)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // the wait asked for would be 68 years
	defer cancel()
	if _, err := cms.Patch(ctx, "x", types.ApplyPatchType, []byte(`{}`), metav1.PatchOptions{FieldManager: "syncloop"}); !apierrors.IsTooManyRequests(err) || asked.Load() != 1 {
		t.Errorf("a 429 with Retry-After: %v after %d requests; want it returned after one", err, asked.Load())
	}
}
