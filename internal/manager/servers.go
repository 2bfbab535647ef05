package manager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// server is an HTTP server on a listener of its own.
type server struct {
	what string
	ln   net.Listener
	srv  *http.Server
	// draining, when not nil, makes closing graceful: it is set first, and
	// the handler then ends each connection with its answer.
	draining *atomic.Bool
}

// serves reports whether addr turns its server on.
func serves(addr string) bool { return addr != "" && addr != "0" }

// limits bound what a client may hold of one of syncloop's servers — a
// connection, its goroutine and buffers — however slowly it sends or
// reads (a slowloris), or however long it stays idle.
type limits struct {
	// header bounds the TLS handshake and the reading of a request's
	// headers; read the whole reading of a request, its body included;
	// write the time from the end of its headers to the end of its
	// answer; idle how long a connection kept alive waits for its next
	// request.
	header, read, write, idle time.Duration
	// headerBytes bounds a request's headers (HTTP/2: their list).
	headerBytes int
}

// The limits of each server. Every one reads headers within 5 s, of at
// most 64 KiB (a token in Authorization is a few KiB), and keeps an idle
// connection 2 min, longer than its clients' transports keep theirs (90 s
// in Go's and client-go's), so that the client closes first.
var (
	// A scrape is a GET with no body, its answer written within
	// Prometheus' scrape timeout (10 s by default).
	metricsLimits = limits{header: 5 * time.Second, read: 10 * time.Second, write: time.Minute, idle: 2 * time.Minute, headerBytes: 64 << 10}
	// A probe is a GET answered within the kubelet's timeout (1 s).
	probeLimits = limits{header: 5 * time.Second, read: 10 * time.Second, write: 10 * time.Second, idle: 2 * time.Minute, headerBytes: 64 << 10}
	// The API server gives up on a conversion call after 30 s: nothing
	// slower is worth reading or answering.
	webhookLimits = limits{header: 5 * time.Second, read: 30 * time.Second, write: 30 * time.Second, idle: 2 * time.Minute, headerBytes: 64 << 10}
	// A profile runs for as long as asked (?seconds=), which Go's
	// profiler refuses beyond the write limit.
	pprofLimits = limits{header: 5 * time.Second, read: 10 * time.Second, write: 10 * time.Minute, idle: 2 * time.Minute, headerBytes: 64 << 10}
)

// listen listens on addr for h, within l; nothing is served until serve.
func listen(addr, what string, h http.Handler, l limits) (*server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return &server{what: what, ln: ln, srv: newServer(h, l)}, nil
}

// newServer serves h within l.
func newServer(h http.Handler, l limits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.header, ReadTimeout: l.read, WriteTimeout: l.write,
		IdleTimeout: l.idle, MaxHeaderBytes: l.headerBytes}
}

// serve serves until the server is closed.
func (s *server) serve(ctx context.Context) {
	go func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Server failed", "server", s.what)
		}
	}()
}

// Close stops serving; a server never served closes its listener.
func (s *server) Close() {
	if s.draining != nil {
		// The conversion webhook, whose callers (the API server) do not
		// retry a conversion that broke: first every answer says
		// Connection: close — over HTTP/2 a GOAWAY, after which the
		// client sends the requests not begun elsewhere — so that a
		// client's connections end cleanly rather than under a request
		// it writes; new connections are still served while the
		// endpoint leaves the Service; then requests under way finish.
		s.draining.Store(true)
		time.Sleep(serverLinger)
		ctx, cancel := context.WithTimeout(context.Background(), serverDrain)
		defer cancel()
		if s.srv.Shutdown(ctx) == nil {
			return
		}
	}
	s.srv.Close()
	s.ln.Close()
}

// serverDrain bounds how long a graceful server waits for its requests
// under way when syncloop stops; serverLinger is how long it serves
// without keep-alives before (kube-proxy stops sending new connections
// to a terminating endpoint within it).
const (
	serverDrain  = 10 * time.Second
	serverLinger = 2 * time.Second
)
