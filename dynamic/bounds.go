package dynamic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
)

// Another cluster's API server is a peer, not syncloop's own: whoever
// wrote its kubeconfig Secret chose it, and it may hang, trickle or
// answer without end. Bound makes its client's requests end: each one
// but a watch within a deadline, its answer within a size; a watch's
// stream an event at a time within a size. A request past a bound fails
// as one that found no answer (NoAnswer), so that the cluster is set
// aside as one that does not answer.

// Bounds of the requests to another cluster.
type Bounds struct {
	// Timeout is how long a request other than a watch may take, its
	// answer read whole; 0: DefaultRemoteTimeout.
	Timeout time.Duration
	// MaxAnswer bounds the answer of a request other than a watch; 0:
	// DefaultMaxAnswer.
	MaxAnswer int64
	// MaxEvent bounds each event of a watch's stream not in protobuf
	// (client-go bounds protobuf ones at 16 MiB itself); 0:
	// DefaultMaxEvent.
	MaxEvent int64
}

// Defaults of Bounds.
const (
	// DefaultRemoteTimeout: a write or a page of a list takes well under
	// a second on an API server that answers; one that takes this long
	// holds a worker that others are waiting for.
	DefaultRemoteTimeout = 30 * time.Second
	// DefaultMaxAnswer: a list of one rule's children in one cluster —
	// ten thousand of a few KiB — is a few tens of MiB.
	DefaultMaxAnswer = 64 << 20
	// DefaultMaxEvent: an object etcd stores is at most 1.5 MiB by
	// default; client-go's bound of a protobuf watch event.
	DefaultMaxEvent = 16 << 20
)

// ErrTooLarge is wrapped by the error of an answer or a watch event over
// its bound.
var ErrTooLarge = errors.New("answer over syncloop's bound")

// Bound makes the requests of clients of cfg keep to b.
func Bound(cfg *rest.Config, b Bounds) {
	if b.Timeout <= 0 {
		b.Timeout = DefaultRemoteTimeout
	}
	if b.MaxAnswer <= 0 {
		b.MaxAnswer = DefaultMaxAnswer
	}
	if b.MaxEvent <= 0 {
		b.MaxEvent = DefaultMaxEvent
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &bounded{next: rt, b: b} })
}

type bounded struct {
	next http.RoundTripper
	b    Bounds
}

// WrappedRoundTripper lets client-go find the transport underneath.
func (t *bounded) WrappedRoundTripper() http.RoundTripper { return t.next }

func (t *bounded) RoundTrip(req *http.Request) (*http.Response, error) {
	if isWatch(req) {
		resp, err := t.next.RoundTrip(req)
		if err == nil {
			if err := oneHop(resp); err != nil {
				return nil, err
			}
			// client-go decodes whatever is not protobuf as JSON, whatever
			// the Content-Type says: all but protobuf is bounded as JSON.
			if !isProtobuf(resp.Header.Get("Content-Type")) {
				resp.Body = &eventBound{r: resp.Body, max: t.b.MaxEvent}
			}
		}
		return resp, err
	}
	ctx, cancel := context.WithTimeoutCause(req.Context(), t.b.Timeout,
		fmt.Errorf("%w: no answer read whole within %s", context.DeadlineExceeded, t.b.Timeout))
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	if err := oneHop(resp); err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &answerBound{r: resp.Body, left: t.b.MaxAnswer, max: t.b.MaxAnswer, cancel: cancel, ctx: ctx}
	return resp, nil
}

// oneHop keeps a request to one round trip within its deadline: a
// redirect is refused (followed, it would carry the kubeconfig's
// credentials to an address the Secret's writer chose, plain http
// included, and each hop would get a deadline of its own), and a
// Retry-After is dropped, so that client-go does not wait it out and ask
// again (up to ten times, each wait as long as the answer says): the
// answer fails its reconcile, retried with the queue's backoff.
func oneHop(resp *http.Response) error {
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		_ = resp.Body.Close()
		return fmt.Errorf("the API server answered %d, a redirect: refused, never followed", resp.StatusCode)
	}
	resp.Header.Del("Retry-After")
	return nil
}

func isProtobuf(contentType string) bool {
	t, _, err := mime.ParseMediaType(contentType)
	return err == nil && t == "application/vnd.kubernetes.protobuf"
}

// answerBound is an answer read within its request's deadline and size.
type answerBound struct {
	r         io.ReadCloser
	left, max int64
	ctx       context.Context
	cancel    context.CancelFunc
}

func (a *answerBound) Read(p []byte) (int, error) {
	if a.left <= 0 {
		return 0, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, a.max)
	}
	if int64(len(p)) > a.left {
		p = p[:a.left+1] // one byte more tells an answer of exactly max from a longer one
	}
	n, err := a.r.Read(p)
	a.left -= int64(n)
	if a.left < 0 {
		return n, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, a.max)
	}
	if err != nil && a.ctx.Err() != nil {
		err = context.Cause(a.ctx)
	}
	return n, err
}

func (a *answerBound) Close() error {
	defer a.cancel()
	return a.r.Close()
}

// eventBound is a JSON watch stream whose events are each at most max
// bytes. An event is one JSON value, whatever its lines (client-go's
// framer reads a value across newlines): eventBound follows the
// nesting, outside strings, and counts from each top-level value's
// first byte to its last.
type eventBound struct {
	r     io.ReadCloser
	max   int64
	size  int64 // bytes of the value under way
	depth int   // open objects and arrays
	str   bool  // inside a string
	esc   bool  // after a backslash in a string
}

func (e *eventBound) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	for _, c := range p[:n] {
		if !e.str && e.depth == 0 && (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
			e.size = 0 // between values
			continue
		}
		if e.size++; e.size > e.max {
			return 0, fmt.Errorf("%w: a watch event of more than %d bytes", ErrTooLarge, e.max)
		}
		e.scan(c)
	}
	return n, err
}

// scan follows c's effect on the nesting; a top-level value that closes
// ends the event.
func (e *eventBound) scan(c byte) {
	switch {
	case e.esc:
		e.esc = false
	case e.str:
		e.esc, e.str = c == '\\', c != '"'
	case c == '"':
		e.str = true
	case c == '{' || c == '[':
		e.depth++
	case (c == '}' || c == ']') && e.depth > 0:
		if e.depth--; e.depth == 0 {
			e.size = 0
		}
	}
}

func (e *eventBound) Close() error { return e.r.Close() }
