package manager

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// hangGuard bounds how long a test waits for a server to let go of a
// client; the limits under test are a fraction of it.
const hangGuard = 20 * time.Second

// TestServersBoundSlowClients: a client that sends its headers or its
// body never to the end, reads its answer never, stays idle on a
// connection kept alive, or sends headers beyond the limit does not hold
// its connection or handler: each is cut off by its limit.
func TestServersBoundSlowClients(t *testing.T) {
	l := limits{header: 200 * time.Millisecond, read: 400 * time.Millisecond, write: 400 * time.Millisecond, idle: 400 * time.Millisecond, headerBytes: 4 << 10}
	read, wrote := make(chan error, 1), make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		read <- err
	})
	mux.HandleFunc("/write", func(w http.ResponseWriter, _ *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		var err error
		for i := 0; i < 1024 && err == nil; i++ { // 1 GiB: never all buffered
			_, err = w.Write(chunk)
		}
		wrote <- err
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(mux, l)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	dial := func(t *testing.T, send string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, send); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// closed waits for the server to close c, after reading what it sends.
	closed := func(t *testing.T, c net.Conn) string {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(hangGuard))
		data, err := io.ReadAll(c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection still held after %v", hangGuard)
		}
		return string(data)
	}
	handler := func(t *testing.T, handled chan error) error {
		t.Helper()
		select {
		case err := <-handled:
			return err
		case <-time.After(hangGuard):
			t.Fatalf("the handler still held after %v", hangGuard)
			return nil
		}
	}

	t.Run("headers never finished", func(t *testing.T) {
		closed(t, dial(t, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: "))
	})
	t.Run("a body never finished", func(t *testing.T) {
		c := dial(t, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nonly this")
		if err := handler(t, read); err == nil {
			t.Error("the handler read a body that never came to its end")
		}
		closed(t, c)
	})
	t.Run("an answer never read", func(t *testing.T) {
		c := dial(t, "GET /write HTTP/1.1\r\nHost: x\r\n\r\n")
		if err := handler(t, wrote); err == nil {
			t.Error("the handler wrote 1 GiB to a client that reads nothing")
		}
		c.Close()
	})
	t.Run("idle after an answer", func(t *testing.T) {
		c := dial(t, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(hangGuard))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the first request: %v %v", resp, err)
		}
		resp.Body.Close()
		closed(t, c)
	})
	t.Run("headers beyond the limit", func(t *testing.T) {
		c := dial(t, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 16<<10)+"\r\n\r\n")
		if got := closed(t, c); !strings.HasPrefix(got, "HTTP/1.1 431") {
			t.Errorf("headers of 16 KiB: %.40q, want 431", got)
		}
	})
}

// TestServerLimits: every server syncloop opens is bounded in each way —
// headers, request, answer, idle connection, header bytes — and listen
// applies them.
func TestServerLimits(t *testing.T) {
	for name, l := range map[string]limits{"metrics": metricsLimits, "probes": probeLimits, "webhook": webhookLimits, "pprof": pprofLimits} {
		if l.header <= 0 || l.read < l.header || l.write <= 0 || l.idle <= 0 || l.headerBytes <= 0 || l.headerBytes > 1<<20 {
			t.Errorf("%s: limits %+v: want every one set, headers read within the request", name, l)
		}
	}
	s, err := listen("127.0.0.1:0", "conversion webhook", http.NotFoundHandler(), webhookLimits)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if srv := s.srv; srv.ReadHeaderTimeout != webhookLimits.header || srv.ReadTimeout != webhookLimits.read || srv.WriteTimeout != webhookLimits.write ||
		srv.IdleTimeout != webhookLimits.idle || srv.MaxHeaderBytes != webhookLimits.headerBytes {
		t.Errorf("listen made a server of %v/%v/%v/%v/%d, want %+v", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes, webhookLimits)
	}
}

// TestConversionsClientCA: a client CA file that cannot be read stops
// the start, rather than a webhook that trusts no one or everyone.
func TestConversionsClientCA(t *testing.T) {
	o := Options{CRDs: CRDs{ClientCA: t.TempDir() + "/none.crt"}}
	if _, err := newConversions(o, nil, nil, true); err == nil || !strings.Contains(err.Error(), "client CAs") {
		t.Errorf("a missing client CA file: %v", err)
	}
}
