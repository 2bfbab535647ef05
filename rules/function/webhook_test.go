package function

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestWebhook calls a hook over http and https: the input is POSTed as
// JSON and the body comes back; failures say how the hook failed.
func TestWebhook(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/echo":
			if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
				http.Error(w, "want a POST of JSON", http.StatusBadRequest)
				return
			}
			_, _ = w.Write(body)
		case "/fail":
			http.Error(w, "no parent in the request\nmore", http.StatusInternalServerError)
		case "/slow":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 2048)))
		}
	})
	plain := httptest.NewServer(handler)
	defer plain.Close()
	secure := httptest.NewTLSServer(handler)
	defer secure.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw})
	limits := Limits{Timeout: 500 * time.Millisecond, Output: 1024}
	ctx := context.Background()

	for _, c := range []struct {
		name, url string
		ca        []byte
		want      string // the output, or the start of the error
		failed    bool
	}{
		{name: "http", url: plain.URL + "/echo", want: `{"parent":{}}`},
		{name: "https with its CA", url: secure.URL + "/echo", ca: ca, want: `{"parent":{}}`},
		{name: "https, CA unknown", url: secure.URL + "/echo", want: "unreachable: tls: failed to verify certificate", failed: true},
		{name: "error status", url: plain.URL + "/fail", want: "answered 500 Internal Server Error (stderr: no parent in the request)", failed: true},
		{name: "slow", url: plain.URL + "/slow", want: "gave no answer within its timeout of 500ms", failed: true},
		{name: "too much", url: plain.URL + "/big", want: "sent more than the output limit of 1024 bytes", failed: true},
		{name: "nobody there", url: "http://127.0.0.1:1/echo", want: "unreachable: dial tcp 127.0.0.1:1", failed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, err := NewWebhook(c.url, c.ca)
			if err != nil {
				t.Fatal(err)
			}
			res, err := w.Call(ctx, []byte(`{"parent":{}}`), limits)
			if !c.failed {
				if err != nil || string(res.Stdout) != c.want {
					t.Fatalf("got %q, %v; want %q", res.Stdout, err, c.want)
				}
				return
			}
			var ce *CallError
			if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("got %v; want a CallError starting %q", err, c.want)
			}
		})
	}
}

// TestNewWebhook refuses what cannot be a hook's address.
func TestNewWebhook(t *testing.T) {
	for url, want := range map[string]string{
		"ftp://hooks/sync":          "the scheme must be http or https",
		"http:///sync":              "names no host",
		"https://user:pw@hook/sync": "credentials do not belong in a URL",
	} {
		if _, err := NewWebhook(url, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", url, err, want)
		}
	}
	if _, err := NewWebhook("http://hook/sync", []byte("x")); err == nil || !strings.Contains(err.Error(), "for an https URL") {
		t.Errorf("CA bundle on http: got %v", err)
	}
	if _, err := NewWebhook("https://hook/sync", []byte("not pem")); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("bad CA bundle: got %v", err)
	}
	if got := ServiceURL("", "hello", "demo", 0, "sync"); got != "http://hello.demo:80/sync" {
		t.Errorf("ServiceURL: %s", got)
	}
}

// TestWebhookRedirectsRefused: a hook that answers with a redirect fails
// its call, naming the redirect — to plain http on another host from an
// https hook whose CA bundle is pinned, to another https host, or to
// another path of the same server — and the request, which carries the
// trigger and what the rule read, is never sent where it points.
func TestWebhookRedirectsRefused(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		_, _ = io.WriteString(w, `{"children": []}`)
	}))
	defer other.Close()
	otherTLS := httptest.NewTLSServer(other.Config.Handler)
	defer otherTLS.Close()
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/same":
			elsewhere.Add(1)
			_, _ = io.WriteString(w, `{"children": []}`)
		case "/to-http":
			http.Redirect(w, r, other.URL+"/sync", http.StatusTemporaryRedirect)
		case "/to-https":
			http.Redirect(w, r, otherTLS.URL+"/sync", http.StatusPermanentRedirect)
		case "/to-same-host":
			http.Redirect(w, r, "/same", http.StatusFound)
		}
	}))
	defer hook.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hook.Certificate().Raw})
	for path, want := range map[string]string{
		"/to-http":      "answered 307 Temporary Redirect with a redirect to " + other.URL + "/sync: redirects are not followed: give the URL that answers",
		"/to-https":     "answered 308 Permanent Redirect with a redirect to " + otherTLS.URL + "/sync: redirects are not followed: give the URL that answers",
		"/to-same-host": "answered 302 Found with a redirect to " + hook.URL + "/same: redirects are not followed: give the URL that answers",
	} {
		w, err := NewWebhook(hook.URL+path, ca)
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Call(t.Context(), []byte(`{"parent": {"secret": "x"}}`), Limits{Timeout: 30 * time.Second, Output: 1 << 20})
		if ce, ok := errors.AsType[*CallError](err); !ok || ce.Error() != want || len(res.Stdout) > 0 {
			t.Errorf("%s: got %q, %v; want a CallError %q", path, res.Stdout, err, want)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("%d requests followed a redirect", n)
	}
}

// TestWebhookBodyReadThroughLimit: of a hook's answer no more than the
// output limit is read — nothing when its Content-Length says more — and
// of an error's body only the start kept: a hook that sends a GiB holds
// the call for none of it. What the server could write before the call
// let go is counted.
func TestWebhookBodyReadThroughLimit(t *testing.T) {
	const limit = 64 << 20
	written := make(chan int64, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int64
		defer func() { written <- n }()
		switch r.URL.Path {
		case "/declared":
			w.Header().Set("Content-Length", strconv.Itoa(1<<30))
		case "/chunked":
		case "/error":
			w.WriteHeader(http.StatusInternalServerError)
		}
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for n < 1<<30 {
			m, err := w.Write(chunk)
			n += int64(m)
			if err != nil {
				return
			}
		}
	}))
	defer hook.Close()
	for path, want := range map[string]string{
		"/declared": "sent more than the output limit of 67108864 bytes",
		"/chunked":  "sent more than the output limit of 67108864 bytes",
		"/error":    "answered 500 Internal Server Error (stderr: xxxx",
	} {
		w, err := NewWebhook(hook.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Call(t.Context(), []byte(`{}`), Limits{Timeout: time.Minute, Output: limit})
		if ce, ok := errors.AsType[*CallError](err); !ok || !strings.HasPrefix(ce.Error(), want) {
			t.Errorf("%s: got %v, want a CallError %q", path, err, want)
		}
		hook.CloseClientConnections() // the server's writes fail from here on
		n := <-written
		if path != "/chunked" && n >= limit/2 {
			t.Errorf("%s: the server wrote %d MiB before the call let go: it was read", path, n>>20)
		}
		if path == "/chunked" && n > limit+(32<<20) {
			t.Errorf("%s: the server wrote %d MiB: more than the limit was read", path, n>>20)
		}
	}
}
