package campaign

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Faults are the probabilities of what the proxy does to a request it
// forwards; each is drawn once per request.
type Faults struct {
	// ResetBefore aborts the request before it reaches the API server;
	// ResetAfter after the API server has answered it (a write that was
	// made, whose answer is lost).
	ResetBefore, ResetAfter float64
	// ServerError answers 500 or 503 without forwarding.
	ServerError float64
	// TooMany answers 429 with Retry-After: 1 without forwarding.
	TooMany float64
	// Latency delays the request by up to MaxLatency.
	Latency    float64
	MaxLatency time.Duration
	// WatchCut ends a watch's stream after up to WatchCutAfter.
	WatchCut      float64
	WatchCutAfter time.Duration
	// WatchGone answers a watch that resumes from a resourceVersion with
	// 410 Gone, as after an etcd compaction: the informer lists again.
	WatchGone float64
}

// DefaultFaults: about one request in six meets a fault.
var DefaultFaults = Faults{ResetBefore: 0.02, ResetAfter: 0.02, ServerError: 0.03, TooMany: 0.03,
	Latency: 0.1, MaxLatency: 300 * time.Millisecond, WatchCut: 0.3, WatchCutAfter: 10 * time.Second, WatchGone: 0.2}

// proxy is a TLS reverse proxy in front of kube-apiserver that injects
// faults into what it forwards, drawn from one seeded source: the requests
// of syncloop's replicas go through it, everyone else's do not. It serves
// the API server's own certificate (valid for 127.0.0.1), so clients
// trust it as they trust the API server.
type proxy struct {
	upstream *url.URL
	client   *http.Client
	server   *http.Server
	addr     string

	on     atomic.Bool // faults are injected only while on
	faults Faults
	mu     sync.Mutex // guards rng, counts and owed
	rng    *rand.Rand
	counts map[string]int // by kind of fault; writes: "…/write"
	owed   map[string]bool
}

// startProxy starts a proxy to the API server at upstream, serving with
// the certificate and key in dir (testenv's apiserver.crt and .key) and
// trusting caData upstream.
func startProxy(upstream string, dir string, caData []byte, seed uint64, faults Faults) (*proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caData)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"))
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true,
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{upstream: u, client: &http.Client{Transport: transport}, addr: ln.Addr().String(),
		faults: faults, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), counts: map[string]int{}}
	p.server = &http.Server{Handler: p, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		ErrorLog: nullLogger()}
	go func() { _ = p.server.ServeTLS(ln, "", "") }()
	return p, nil
}

// URL is where clients reach the proxy.
func (p *proxy) URL() string { return "https://" + p.addr }

func (p *proxy) close() {
	_ = p.server.Close()
	p.client.CloseIdleConnections()
}

// draw reports whether a fault of probability prob happens, and counts it
// as kind when it does.
func (p *proxy) draw(prob float64, kind string, write bool) bool {
	if prob == 0 || !p.on.Load() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.owed[kind] {
		delete(p.owed, kind)
	} else if p.rng.Float64() >= prob {
		return false
	}
	p.counts[kind]++
	if write {
		p.counts[kind+"/write"]++
	}
	return true
}

// oweMissing makes each kind of fault with a probability that has not
// happened yet happen at the next request it can: a short campaign, or
// one whose syncloop made few requests, still meets every kind.
func (p *proxy) oweMissing() {
	f := p.faults
	p.mu.Lock()
	defer p.mu.Unlock()
	p.owed = map[string]bool{}
	for kind, prob := range map[string]float64{"reset-before": f.ResetBefore, "reset-after": f.ResetAfter,
		"server-error": f.ServerError, "too-many-requests": f.TooMany, "latency": f.Latency,
		"watch-cut": f.WatchCut, "watch-gone": f.WatchGone} {
		if prob > 0 && p.counts[kind] == 0 {
			p.owed[kind] = true
		}
	}
}

// owing reports whether a kind of fault is owed still.
func (p *proxy) owing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owed) > 0
}

// duration draws a duration up to max.
func (p *proxy) duration(max time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Duration(p.rng.Int64N(int64(max) + 1))
}

// injected is what the proxy did, by kind of fault.
func (p *proxy) injected() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.counts))
	for k, v := range p.counts {
		out[k] = v
	}
	return out
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f := p.faults
	watch := r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1"
	write := r.Method != http.MethodGet
	if watch {
		rv := r.URL.Query().Get("resourceVersion")
		if rv != "" && rv != "0" && r.URL.Query().Get("sendInitialEvents") == "" && p.draw(f.WatchGone, "watch-gone", false) {
			status(w, http.StatusGone, "Expired", "too old resource version: injected by the fault proxy")
			return
		}
	}
	switch {
	case p.draw(f.ResetBefore, "reset-before", write):
		panic(http.ErrAbortHandler)
	case p.draw(f.ServerError, "server-error", write):
		code := http.StatusInternalServerError
		if p.duration(1) == 1 {
			code = http.StatusServiceUnavailable
		}
		status(w, code, "InternalError", "injected by the fault proxy")
		return
	case p.draw(f.TooMany, "too-many-requests", write):
		w.Header().Set("Retry-After", "1")
		status(w, http.StatusTooManyRequests, "TooManyRequests", "injected by the fault proxy")
		return
	case p.draw(f.Latency, "latency", false):
		time.Sleep(p.duration(f.MaxLatency))
	}
	resetAfter := !watch && p.draw(f.ResetAfter, "reset-after", write)
	ctx, cut := context.WithCancel(r.Context())
	defer cut()
	var cutting atomic.Bool
	if watch && p.draw(f.WatchCut, "watch-cut", false) {
		timer := time.AfterFunc(p.duration(f.WatchCutAfter), func() { cutting.Store(true); cut() })
		defer timer.Stop()
	}
	resp, err := p.forward(r.WithContext(ctx))
	switch {
	case err != nil && cutting.Load():
		panic(http.ErrAbortHandler)
	case err != nil:
		status(w, http.StatusBadGateway, "InternalError", "the fault proxy cannot reach the API server: "+err.Error())
		return
	}
	defer resp.Body.Close()
	if resetAfter {
		_, _ = io.Copy(io.Discard, resp.Body)
		panic(http.ErrAbortHandler)
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if !watch {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	copyStream(w, resp.Body)
	if cutting.Load() {
		panic(http.ErrAbortHandler) // cut mid-stream: the client sees it broken, not ended
	}
}

// forward sends r on to the API server.
func (p *proxy) forward(r *http.Request) (*http.Response, error) {
	u := *p.upstream
	u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), r.Body)
	if err != nil {
		return nil, err
	}
	out.ContentLength = r.ContentLength
	for k, vs := range r.Header {
		for _, v := range vs {
			out.Header.Add(k, v)
		}
	}
	return p.client.Do(out)
}

// copyStream copies a watch's stream as it comes, flushing each read,
// until it ends (or the request's context is cancelled).
func copyStream(w http.ResponseWriter, body io.Reader) {
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}

// status answers with a Kubernetes Status of code and reason.
func status(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, msg, reason, code)
}

// describe lists counts by kind, sorted: "latency 12, reset-before 3".
func describe(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// nullLogger drops the server's own log: aborted streams are the point.
func nullLogger() *log.Logger { return log.New(io.Discard, "", 0) }
