package dynamic

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestBufferWatches: a watch's stream is read through a buffer of
// watchBuffer bytes, which hands on each event as it comes — it never
// waits to fill while the stream stays open — and other answers are left
// as they are.
func TestBufferWatches(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("watch") != "true" {
			_, _ = io.WriteString(w, `{"kind":"ConfigMap"}`)
			return
		}
		_, _ = io.WriteString(w, `{"type":"ADDED"}`+"\n")
		w.(http.Flusher).Flush()
		<-release // the stream stays open
		_, _ = io.WriteString(w, `{"type":"MODIFIED"}`+"\n")
	}))
	defer srv.Close()
	defer close(release)
	client := &http.Client{Transport: bufferWatches(http.DefaultTransport)}

	resp, err := client.Get(srv.URL + "/api/v1/configmaps?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, ok := resp.Body.(*bufferedBody)
	if !ok || body.Size() != watchBuffer {
		t.Fatalf("a watch's body is a %T, want one read through a buffer of %d bytes", resp.Body, watchBuffer)
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(resp.Body).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if s != `{"type":"ADDED"}`+"\n" {
			t.Errorf("the first event read %q", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event was not handed on while the stream stayed open: the buffer waits to fill")
	}

	resp, err = client.Get(srv.URL + "/api/v1/configmaps/a")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, ok := resp.Body.(*bufferedBody); ok {
		t.Error("a get's answer is read through a watch's buffer")
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != `{"kind":"ConfigMap"}` {
		t.Errorf("a get's answer: %q, %v", b, err)
	}
}
