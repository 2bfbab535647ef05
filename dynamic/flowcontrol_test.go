package dynamic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// flowCounts is a FlowMetrics that counts.
type flowCounts struct {
	tooMany atomic.Int64
	mu      sync.Mutex
	waited  map[string]time.Duration
	limits  []int
}

func (c *flowCounts) TooManyRequests() { c.tooMany.Add(1) }
func (c *flowCounts) Waited(reason string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waited == nil {
		c.waited = map[string]time.Duration{}
	}
	c.waited[reason] += d
}
func (c *flowCounts) ConcurrencyLimit(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limits = append(c.limits, n)
}

// seats is a test server with a fixed number of seats, as an API Priority
// and Fairness priority level with limitResponse Reject: a request that
// finds every seat taken gets 429 with Retry-After: 0 (so that the test
// need not wait out whole seconds). Every request must carry its body back
// as the header X-Body, which proves a retried request is sent whole.
type seats struct {
	n        int64
	inUse    atomic.Int64
	served   atomic.Int64
	rejected atomic.Int64
	badBody  atomic.Int64
}

func (s *seats) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if string(body) != r.Header.Get("X-Body") {
		s.badBody.Add(1)
	}
	if s.inUse.Add(1) > s.n {
		s.inUse.Add(-1)
		s.rejected.Add(1)
		w.Header().Set("Retry-After", "0")
		http.Error(w, "too many requests", http.StatusTooManyRequests)
		return
	}
	defer s.inUse.Add(-1)
	time.Sleep(200 * time.Microsecond) // service time: the seat is held
	s.served.Add(1)
}

// send makes n POSTs from workers goroutines and returns how many did not
// end in 200.
func send(t *testing.T, client *http.Client, url string, n, workers int) int64 {
	t.Helper()
	var failed atomic.Int64
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				body := fmt.Sprintf("request %d", i)
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
				req.Header.Set("X-Body", body)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				drain(resp)
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return failed.Load()
}

// TestFlowControlBacksOffAsAWhole: 16 concurrent clients against one seat.
// Every request succeeds, each retried with its body; the flow control cuts
// the concurrency to the one seat within a few round trips, so 429s are a
// handful instead of most requests.
func TestFlowControlBacksOffAsAWhole(t *testing.T) {
	const n, workers = 800, 16
	s := &seats{n: 1}
	srv := httptest.NewServer(s)
	defer srv.Close()

	m := &flowCounts{}
	fc := NewFlowControl(m)
	if failed := send(t, &http.Client{Transport: fc.Wrap(http.DefaultTransport)}, srv.URL, n, workers); failed != 0 {
		t.Fatalf("%d of %d requests failed", failed, n)
	}
	if s.served.Load() != n || s.badBody.Load() != 0 {
		t.Fatalf("server served %d of %d requests; %d retries came without their body", s.served.Load(), n, s.badBody.Load())
	}
	// Halving from 16 in flight reaches 1 in four cuts; each round trip
	// that exceeds the seat costs at most its in-flight requests. The limit
	// may probe one higher once a second, costing one 429 each time.
	t.Logf("%d of %d requests refused", s.rejected.Load(), n)
	if got := s.rejected.Load(); got > 40 {
		t.Errorf("%d requests were refused; the flow control should have backed off after a few", got)
	}
	if m.tooMany.Load() != s.rejected.Load() {
		t.Errorf("counted %d 429s, the server sent %d", m.tooMany.Load(), s.rejected.Load())
	}
	if l := fc.Limit(); l < 1 || l > 2 {
		t.Errorf("limit %d after pushback from one seat, want 1 (or 2, probing)", l)
	}
}

// TestFlowControlLimit walks the limit through a cut, a second 429 of the
// same round trip (no second cut), growth after a quiet second, and lifting.
func TestFlowControlLimit(t *testing.T) {
	clock := clocktesting.NewFakeClock(time.Unix(0, 0))
	m := &flowCounts{}
	f := newFlowControl(m, clock)
	ctx := t.Context()

	var epochs []uint64
	for range 8 {
		e, err := f.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		epochs = append(epochs, e)
	}
	if f.Limit() != 0 {
		t.Fatalf("limit %d before any 429, want none", f.Limit())
	}
	f.release(true, epochs[0]) // 8 in flight: cut to 4
	f.release(true, epochs[1]) // same round trip: no second cut
	if got := f.Limit(); got != 4 {
		t.Fatalf("limit %d after 429s with 8 in flight, want 4", got)
	}
	for _, e := range epochs[2:7] {
		f.release(false, e)
	}
	stale := epochs[7] // sent before the cut, still in flight

	// At the limit a fifth request waits for a slot.
	held := []uint64{stale}
	for range 3 {
		e, _ := f.acquire(ctx)
		held = append(held, e)
	}
	got := make(chan error, 1)
	go func() {
		_, err := f.acquire(ctx)
		got <- err
	}()
	poll(t, "the fifth request to wait", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.waiters) == 1
	})
	select {
	case err := <-got:
		t.Fatalf("a fifth request got a slot under limit 4 (err %v)", err)
	default:
	}
	// After a quiet second the next release grows the limit to 5 and lets
	// the waiter in.
	clock.Step(growInterval)
	f.release(false, held[1])
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if l := f.Limit(); l != 5 {
		t.Fatalf("limit %d after a quiet second at 4, want 5", l)
	}
	// A 429 for a request sent before the cut changes nothing now.
	clock.Step(time.Millisecond)
	f.release(true, stale)
	if l := f.Limit(); l != 5 {
		t.Fatalf("a stale 429 changed the limit to %d", l)
	}
	f.release(false, held[2])
	f.release(false, held[3])
	f.mu.Lock()
	inFlight := f.inFlight
	f.mu.Unlock()
	if inFlight != 1 { // the waiter's
		t.Fatalf("%d in flight, want 1", inFlight)
	}
	// Idle: once the limit is more than twice the peak it is lifted.
	clock.Step(growInterval)
	f.Limit()
	clock.Step(growInterval)
	if l := f.Limit(); l != 0 {
		t.Fatalf("limit %d after idle seconds, want lifted", l)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if want := []int{4, 5}; len(m.limits) < 3 || m.limits[0] != want[0] || m.limits[1] != want[1] || m.limits[len(m.limits)-1] != 0 {
		t.Errorf("limits reported %v, want 4, 5, …, 0", m.limits)
	}
}

// TestFlowControlWaiterCancelled: a request whose context ends while it
// waits for a slot returns the context's error and holds no slot.
func TestFlowControlWaiterCancelled(t *testing.T) {
	f := newFlowControl(nil, clocktesting.NewFakeClock(time.Unix(0, 0)))
	e1, _ := f.acquire(t.Context())
	e2, _ := f.acquire(t.Context())
	f.release(true, e1) // 2 in flight: limit 1
	_ = e2
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := f.acquire(ctx)
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	f.release(false, e2)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inFlight != 0 || len(f.waiters) != 0 {
		t.Fatalf("%d in flight, %d waiting after all returned", f.inFlight, len(f.waiters))
	}
}

// refusing is a test server that answers every request 429 with
// Retry-After: 0, counting the attempts.
func refusing(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var attempts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		w.Header().Set("Retry-After", "0")
		http.Error(w, "no", http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	return srv, &attempts
}

// TestFlowControlGivesUp: a request refused MaxRetries+1 times returns its
// 429 without Retry-After, so that client-go does not wait it out again.
func TestFlowControlGivesUp(t *testing.T) {
	srv, attempts := refusing(t)
	m := &flowCounts{}
	f := NewFlowControl(m)
	f.maxRetries = 3
	resp, err := (&http.Client{Transport: f.Wrap(http.DefaultTransport)}).Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "" {
		t.Errorf("got %d with Retry-After %q, want 429 without", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if attempts.Load() != 4 || m.tooMany.Load() != 4 {
		t.Errorf("%d attempts, %d counted; want 4 (1 + 3 retries)", attempts.Load(), m.tooMany.Load())
	}
}

// TestFlowControlWatches: a watch, or a request for a Lease, is neither
// retried nor held back by the limit.
func TestFlowControlWatches(t *testing.T) {
	srv, attempts := refusing(t)
	f := NewFlowControl(nil)
	// Limit 1, and that slot taken.
	e, _ := f.acquire(t.Context())
	e2, _ := f.acquire(t.Context())
	f.release(true, e)
	defer f.release(false, e2)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/configmaps?watch=true"},
		{http.MethodPut, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/syncloop"},
	} {
		attempts.Store(0)
		req, _ := http.NewRequestWithContext(ctx, c.method, srv.URL+c.path, nil)
		resp, err := (&http.Client{Transport: f.Wrap(http.DefaultTransport)}).Do(req)
		if err != nil {
			t.Fatalf("%s %s held back: %v", c.method, c.path, err)
		}
		drain(resp)
		if resp.StatusCode != http.StatusTooManyRequests || attempts.Load() != 1 {
			t.Errorf("%s %s: %d after %d attempts, want its 429 after 1", c.method, c.path, resp.StatusCode, attempts.Load())
		}
	}
}
