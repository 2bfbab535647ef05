package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

// TestRunPprof: --pprof-bind-address serves Go's profiler on an address of
// its own; it is off by default, and never served beside /metrics.
func TestRunPprof(t *testing.T) {
	env := testenv.Get(t)
	dir := t.TempDir()
	metrics, profiler := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, []string{"run", "-f", dir, "--kubeconfig", env.Kubeconfig(),
			"--metrics-bind-address", metrics, "--health-probe-bind-address", "0", "--pprof-bind-address", profiler}, io.Discard, io.Discard)
	}()
	defer func() { cancel(); <-exited }()
	pollUntil(t, 60*time.Second, "the profiler's index", func() bool {
		return strings.Contains(httpGet("http://"+profiler+"/debug/pprof/"), "goroutine")
	})
	if got := httpGet("http://" + profiler + "/debug/pprof/goroutine?debug=1"); !strings.Contains(got, "goroutine profile:") {
		t.Errorf("the goroutine profile: %.200q", got)
	}
	pollUntil(t, 60*time.Second, "/metrics", func() bool { return strings.Contains(httpGet("http://"+metrics+"/metrics"), "syncloop_") })
	if got := httpGet("http://" + metrics + "/debug/pprof/"); strings.Contains(got, "goroutine") {
		t.Errorf("the metrics address serves the profiler: %.200q", got)
	}

	if fl := newRunCommand().Flags().Lookup("pprof-bind-address"); fl == nil || fl.DefValue != "" {
		t.Errorf("--pprof-bind-address: %+v, want a flag off by default", fl)
	}
}
