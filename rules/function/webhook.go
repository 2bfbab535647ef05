package function

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// A webhook is code a rule calls over HTTP: the input POSTed as JSON, the
// response body the output — Metacontroller's hook convention, so that a
// hook server written for it serves a rule unchanged. Unlike a module, a
// webhook is not pure and cannot run offline: it is called only where the
// cluster is.

// Webhook is an HTTP endpoint a rule calls. Safe for concurrent use.
type Webhook struct {
	// URL is where requests go.
	URL    string
	client *http.Client
}

// maxResponse bounds a response whose limits say no bound.
var maxResponse = DefaultLimits.Output

// NewWebhook makes the webhook at rawURL (http or https). caBundle, when
// not empty, holds the PEM certificates an https server's chain must end
// in, instead of the system's.
func NewWebhook(rawURL string, caBundle []byte) (*Webhook, error) {
	u, err := url.Parse(rawURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%q is not a URL: %w", rawURL, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%q: the scheme must be http or https", rawURL)
	case u.Host == "":
		return nil, fmt.Errorf("%q names no host", rawURL)
	case u.User != nil:
		return nil, fmt.Errorf("%q: credentials do not belong in a URL a rule records", rawURL)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64 // one per worker: calls reuse their connections
	transport.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if len(caBundle) > 0 {
		if u.Scheme != "https" {
			return nil, fmt.Errorf("%q: a CA bundle is for an https URL", rawURL)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caBundle) {
			return nil, errors.New("the CA bundle holds no PEM certificate")
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Webhook{URL: u.String(), client: &http.Client{Transport: transport, CheckRedirect: refuseRedirect}}, nil
}

// errRedirect is a hook that answered with a redirect.
var errRedirect = errors.New("redirects are not followed: give the URL that answers")

// refuseRedirect refuses every redirect: the request carries the
// trigger, its children and what the lookups read, and a redirect would
// send it where the rule does not say — to another host, or from https
// with a pinned CA bundle to plain http — and take that server's answer
// as the hook's. Metacontroller's Go client would follow it.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("answered %s with a redirect to %s: %w", req.Response.Status, req.URL.Redacted(), errRedirect)
}

// Call POSTs input and returns the response body as the result's Stdout.
// A call that takes longer than limits.Timeout, cannot connect, answers
// other than 2xx (a redirect too: none is followed) or sends more than
// limits.Output bytes is a *CallError (the start of an error response's
// body in its Stderr); ctx's error when ctx ended first. No more than
// limits.Output bytes of a body are read, none when its length says more.
func (w *Webhook) Call(ctx context.Context, input []byte, limits Limits) (Result, error) {
	callCtx, cancel := context.WithTimeout(ctx, limits.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(callCtx, http.MethodPost, w.URL, bytes.NewReader(input))
	if err != nil {
		return Result{}, &CallError{Why: err.Error(), Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return Result{}, failed(ctx, callCtx, limits, err)
	}
	defer resp.Body.Close()
	limit := limits.Output
	if limit <= 0 {
		limit = maxResponse
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		// Of an error's body only its start is kept: only that is read.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxStderr))
		return Result{}, &CallError{Why: fmt.Sprintf("answered %s", resp.Status), Stderr: firstBytes(body, maxStderr)}
	}
	tooMuch := &CallError{Why: fmt.Sprintf("sent more than the output limit of %d bytes", limit)}
	if resp.ContentLength > int64(limit) {
		return Result{}, tooMuch // said before it is sent: nothing read
	}
	body, err := readBody(resp, limit)
	switch {
	case err != nil:
		return Result{}, failed(ctx, callCtx, limits, err)
	case len(body) > limit:
		return Result{}, tooMuch
	}
	return Result{Stdout: body}, nil
}

// readBody reads resp's body up to one byte past limit, into a buffer of
// the length the response says when it says one within the limit.
func readBody(resp *http.Response, limit int) ([]byte, error) {
	var buf bytes.Buffer
	if n := resp.ContentLength; n >= 0 && n <= int64(limit) {
		buf.Grow(int(n) + bytes.MinRead) // what ReadFrom wants free to read on
	}
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, int64(limit)+1))
	return buf.Bytes(), err
}

// failed is the CallError of a request that got no whole answer.
func failed(ctx, callCtx context.Context, limits Limits, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(callCtx.Err(), context.DeadlineExceeded):
		return &CallError{Why: fmt.Sprintf("gave no answer within its timeout of %s", limits.Timeout), Err: err}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is said where the error is reported
	}
	if errors.Is(err, errRedirect) {
		return &CallError{Why: err.Error(), Err: err}
	}
	return &CallError{Why: "unreachable: " + err.Error(), Err: err}
}

func firstBytes(b []byte, n int) []byte {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		b = b[:n]
	}
	return b
}

// ServiceURL is the URL of an in-cluster Service's endpoint, as
// Metacontroller forms it: protocol://name.namespace:port/path (protocol
// http and port 80 unless given).
func ServiceURL(protocol, name, namespace string, port int, path string) string {
	if protocol == "" {
		protocol = "http"
	}
	if port == 0 {
		port = 80
	}
	if path != "" && !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return fmt.Sprintf("%s://%s.%s:%d%s", protocol, name, namespace, port, path)
}
