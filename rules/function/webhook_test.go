package function

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
