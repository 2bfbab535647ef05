package dynamic

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// FlowMetrics receives what FlowControl observes. Implementations must be
// safe for concurrent use.
type FlowMetrics interface {
	// TooManyRequests counts one 429 response.
	TooManyRequests()
	// Waited adds time one request spent waiting because the server pushed
	// back: reason is "retry-after" (the wait a 429 asked for) or "limit"
	// (a free slot under the lowered concurrency limit).
	Waited(reason string, d time.Duration)
	// ConcurrencyLimit reports the concurrency limit: 0 when there is none.
	ConcurrencyLimit(n int)
}

// Defaults of FlowControl.
const (
	// DefaultMaxRetries is how many times a request refused with 429 is sent
	// again (client-go's own number) before the 429 is returned.
	DefaultMaxRetries = 10
	// defaultRetryAfter is the wait after a 429 without a Retry-After.
	defaultRetryAfter = time.Second
	// growInterval is how long the limit must go without a 429 before it
	// grows.
	growInterval = time.Second
)

// FlowControl fits the number of API requests a client has in flight to
// what the API server accepts, instead of to a fixed client-side rate.
//
// Kubernetes protects itself with API Priority and Fairness: a flow over its
// share is queued, and refused with 429 Too Many Requests and a Retry-After
// when its priority level is full. FlowControl therefore limits nothing
// while the server accepts every request. When it refuses one, FlowControl
// backs off as a whole, like TCP's congestion control:
//
//   - it limits the requests in flight to half as many as there were when
//     the 429 came (at least one) — one cut per round trip: a 429 for a
//     request sent before the last cut does not cut again;
//   - the refused request waits out its Retry-After without holding a slot,
//     then is sent again, at most MaxRetries times; after that its 429 is
//     returned without the Retry-After header (it has been honoured), so
//     the caller's own retry logic sees a plain TooManyRequests error;
//   - each second without a 429 the limit grows by a quarter (at least
//     one); once it is more than twice the concurrency actually in use it
//     is lifted.
//
// Watches are long-running requests that hold no server seat once started:
// they are never limited and never retried here (their reflectors back off).
// Requests for Leases are not limited either: a leader's renewal must not
// wait behind a backlog of writes and lose the Lease to pushback.
//
// One FlowControl is shared by every client of a process (Wrap each one's
// transport), so that all of them back off together. Safe for concurrent
// use.
type FlowControl struct {
	metrics    FlowMetrics
	clock      clock.Clock
	maxRetries int

	mu       sync.Mutex
	limit    int // 0: none
	inFlight int
	peak     int    // most requests in flight since the limit last changed
	epoch    uint64 // counts cuts; a request remembers the epoch it was sent in
	changed  time.Time
	waiters  []*waiter // FIFO
}

type waiter struct {
	ready chan struct{} // closed when granted a slot
	epoch uint64
}

// NewFlowControl returns a FlowControl reporting to m (nil: nowhere).
func NewFlowControl(m FlowMetrics) *FlowControl {
	return newFlowControl(m, clock.RealClock{})
}

func newFlowControl(m FlowMetrics, c clock.Clock) *FlowControl {
	if m == nil {
		m = noFlowMetrics{}
	}
	return &FlowControl{metrics: m, clock: c, maxRetries: DefaultMaxRetries}
}

type noFlowMetrics struct{}

func (noFlowMetrics) TooManyRequests()             {}
func (noFlowMetrics) Waited(string, time.Duration) {}
func (noFlowMetrics) ConcurrencyLimit(int)         {}

// Wrap returns rt behind the flow control; it has the signature of
// rest.Config.Wrap's argument.
func (f *FlowControl) Wrap(rt http.RoundTripper) http.RoundTripper {
	return &flowTransport{f: f, next: rt}
}

// Limit is the concurrency limit in force: 0 when there is none.
func (f *FlowControl) Limit() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.growLocked()
	return f.limit
}

type flowTransport struct {
	f    *FlowControl
	next http.RoundTripper
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (t *flowTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

func (t *flowTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if isWatch(req) || isLease(req) {
		resp, err := t.next.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests {
			t.f.metrics.TooManyRequests()
		}
		return resp, err
	}
	f := t.f
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		epoch, err := f.acquire(ctx)
		if err != nil {
			return nil, err
		}
		resp, err := t.next.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests {
			f.release(false, epoch)
			return resp, err
		}
		f.metrics.TooManyRequests()
		f.release(true, epoch)
		wait := retryAfter(resp)
		retry := attempt < f.maxRetries && (req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
		if !retry {
			// Honoured (or not retryable): the caller must not wait again.
			resp.Header.Del("Retry-After")
			return resp, nil
		}
		drain(resp)
		start := f.clock.Now()
		select {
		case <-ctx.Done():
			f.metrics.Waited("retry-after", f.clock.Since(start))
			return nil, ctx.Err()
		case <-f.clock.After(wait):
		}
		f.metrics.Waited("retry-after", f.clock.Since(start))
		next := req.Clone(ctx)
		if req.GetBody != nil {
			if next.Body, err = req.GetBody(); err != nil {
				return nil, err
			}
		}
		req = next
	}
}

// acquire waits for a slot under the limit and returns the epoch the
// request is sent in.
func (f *FlowControl) acquire(ctx context.Context) (uint64, error) {
	f.mu.Lock()
	f.growLocked()
	if len(f.waiters) == 0 && (f.limit == 0 || f.inFlight < f.limit) {
		f.takeLocked()
		epoch := f.epoch
		f.mu.Unlock()
		return epoch, nil
	}
	w := &waiter{ready: make(chan struct{})}
	f.waiters = append(f.waiters, w)
	f.mu.Unlock()

	start := f.clock.Now()
	defer func() { f.metrics.Waited("limit", f.clock.Since(start)) }()
	select {
	case <-w.ready:
		return w.epoch, nil
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, o := range f.waiters {
		if o == w {
			f.waiters = append(f.waiters[:i], f.waiters[i+1:]...)
			return 0, ctx.Err()
		}
	}
	// Granted meanwhile: give the slot back.
	f.inFlight--
	f.grantLocked()
	return 0, ctx.Err()
}

func (f *FlowControl) takeLocked() {
	f.inFlight++
	if f.inFlight > f.peak {
		f.peak = f.inFlight
	}
}

// release frees a slot. tooMany reports a 429 for a request sent in epoch:
// the first such answer of an epoch halves the concurrency.
func (f *FlowControl) release(tooMany bool, epoch uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tooMany && epoch == f.epoch {
		n := f.inFlight
		if f.limit != 0 && f.limit < n {
			n = f.limit
		}
		f.setLimitLocked(max(1, n/2))
		f.epoch++
	}
	f.inFlight--
	f.growLocked()
	f.grantLocked()
}

// growLocked raises the limit after growInterval without a cut, and lifts
// it once it is more than twice the concurrency in use.
func (f *FlowControl) growLocked() {
	if f.limit == 0 || f.clock.Since(f.changed) < growInterval {
		return
	}
	if f.limit > 2*f.peak {
		f.setLimitLocked(0)
	} else {
		f.setLimitLocked(f.limit + max(1, f.limit/4))
	}
	f.grantLocked()
}

func (f *FlowControl) setLimitLocked(n int) {
	f.limit = n
	f.changed = f.clock.Now()
	f.peak = f.inFlight
	f.metrics.ConcurrencyLimit(n)
}

// grantLocked hands free slots to waiters, first come first served.
func (f *FlowControl) grantLocked() {
	for len(f.waiters) > 0 && (f.limit == 0 || f.inFlight < f.limit) {
		w := f.waiters[0]
		f.waiters = f.waiters[1:]
		f.takeLocked()
		w.epoch = f.epoch
		close(w.ready)
	}
}

// isWatch reports whether req is a watch: long-running, holding no server
// seat once its initial events are sent.
func isWatch(req *http.Request) bool {
	if req.Method != http.MethodGet {
		return false
	}
	switch req.URL.Query().Get("watch") {
	case "true", "1":
		return true
	}
	return false
}

// isLease reports whether req is for coordination.k8s.io Leases (leader
// election).
func isLease(req *http.Request) bool {
	return strings.HasPrefix(req.URL.Path, "/apis/coordination.k8s.io/")
}

// retryAfter is the wait a 429 asks for: its Retry-After in seconds, else a
// second.
func retryAfter(resp *http.Response) time.Duration {
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return defaultRetryAfter
}

// drain reads and closes a response body so that its connection is reused.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}
