package dynamic

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

// FuzzEventBound: whatever a remote watch stream holds, eventBound
// passes it through unchanged while no line is longer than its bound, and
// fails it once one is.
func FuzzEventBound(f *testing.F) {
	f.Add([]byte("{\"type\":\"ADDED\"}\n{}\n"), 8)
	f.Add([]byte(strings.Repeat("x", 100)), 10)
	f.Fuzz(func(t *testing.T, stream []byte, bound int) {
		if bound <= 0 || bound > 1<<20 {
			return
		}
		got, err := io.ReadAll(&eventBound{r: io.NopCloser(strings.NewReader(string(stream))), max: int64(bound)})
		longest, line := 0, 0
		for _, c := range stream {
			if line = line + 1; c == '\n' {
				line = 0
			}
			longest = max(longest, line)
		}
		if longest > bound {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("a line of %d bytes passed a bound of %d: %v", longest, bound, err)
			}
			return
		}
		if err != nil || string(got) != string(stream) {
			t.Fatalf("a stream within the bound came out %q, %v", got, err)
		}
	})
}
