package testenv

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// Request is one API request as a RequestCounter saw it.
type Request struct {
	Method string
	Path   string
	Query  string
	// Watch is true for watch requests (GET ...?watch=true).
	Watch bool
	// Body is the body of a DELETE (its DeleteOptions).
	Body string
	// Time is when the request was sent.
	Time time.Time
	// Status is the response's HTTP status code; 0 when no response came
	// (connection refused).
	Status int
	// ContentType is the response's media type (its Content-Type without
	// parameters).
	ContentType string
}

// Verb is the request's Kubernetes verb, roughly: get/list/watch (all GET),
// create (POST), update (PUT), patch (PATCH, which server-side apply uses),
// delete (DELETE).
func (r Request) Verb() string {
	switch r.Method {
	case http.MethodGet:
		if r.Watch {
			return "watch"
		}
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(r.Method)
}

// IsWrite reports whether the request may change state.
func (r Request) IsWrite() bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// DryRun reports whether the request is a server-side dry run: dryRun=All
// in the query, or in a DELETE's DeleteOptions body.
func (r Request) DryRun() bool {
	return strings.Contains(r.Query, "dryRun=All") || strings.Contains(r.Body, `"dryRun":["All"]`)
}

// RequestCounter records every request made through configs it wraps.
// Safe for concurrent use.
type RequestCounter struct {
	mu    sync.Mutex
	reqs  []Request
	stall *Stall
}

// Stall makes the requests that match wait, before they are sent, until
// it is released or their context ends: an API server slow to answer
// them. Only one Stall is in force at a time.
func (c *RequestCounter) Stall(match func(Request) bool) *Stall {
	s := &Stall{c: c, match: match, released: make(chan struct{})}
	c.mu.Lock()
	c.stall = s
	c.mu.Unlock()
	return s
}

// A Stall holds back requests (RequestCounter.Stall).
type Stall struct {
	c        *RequestCounter
	match    func(Request) bool
	released chan struct{}
	once     sync.Once
	waiting  atomic.Int64
}

// Waiting is how many requests wait on s now.
func (s *Stall) Waiting() int { return int(s.waiting.Load()) }

// Release lets the requests held go, and holds none from now on. It may be
// called more than once.
func (s *Stall) Release() {
	s.once.Do(func() {
		s.c.mu.Lock()
		if s.c.stall == s {
			s.c.stall = nil
		}
		s.c.mu.Unlock()
		close(s.released)
	})
}

// wait holds r back if s holds it; the error of its context if that ended.
func (s *Stall) wait(req *http.Request, r Request) error {
	if s == nil || !s.match(r) {
		return nil
	}
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case <-s.released:
		return nil
	case <-req.Context().Done():
		return req.Context().Err()
	}
}

// Wrap returns a copy of cfg whose requests the counter records.
func (c *RequestCounter) Wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			r := Request{
				Method: req.Method, Path: req.URL.Path, Query: req.URL.RawQuery,
				Watch: req.URL.Query().Get("watch") == "true", Time: time.Now(),
			}
			if req.Method == http.MethodDelete && req.Body != nil {
				body, err := io.ReadAll(req.Body)
				req.Body.Close()
				if err != nil {
					return nil, err
				}
				r.Body = string(body)
				req.Body = io.NopCloser(bytes.NewReader(body))
			}
			c.mu.Lock()
			stall := c.stall
			c.mu.Unlock()
			if err := stall.wait(req, r); err != nil {
				return nil, err
			}
			resp, err := rt.RoundTrip(req)
			if err == nil {
				r.Status = resp.StatusCode
				r.ContentType, _, _ = strings.Cut(resp.Header.Get("Content-Type"), ";")
			}
			c.mu.Lock()
			c.reqs = append(c.reqs, r)
			c.mu.Unlock()
			return resp, err
		})
	})
	return cfg
}

// Requests returns the requests recorded so far that match keep (all when
// keep is nil).
func (c *RequestCounter) Requests(keep func(Request) bool) []Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Request
	for _, r := range c.reqs {
		if keep == nil || keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// Reset forgets the requests recorded so far.
func (c *RequestCounter) Reset() {
	c.mu.Lock()
	c.reqs = nil
	c.mu.Unlock()
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
