package testenv

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"
)

// shared is the one control plane of this test binary, started on first use
// by Get and stopped by Main after the tests. A package-level value is right
// here: a test binary is one process, and one control plane per package is
// the contract (starting one costs seconds).
var shared struct {
	once sync.Once
	opts Options
	env  *Env
	err  error
}

// Main runs a test binary's tests and then stops the control plane, if any
// test started one. Call it from TestMain; it does not return.
//
// Under -short no control plane starts and Get skips the test.
// SIGINT and SIGTERM stop the control plane before the binary exits.
func Main(m *testing.M, opts Options) {
	flag.Parse()
	shared.opts = opts

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		stopShared()
		fmt.Fprintf(os.Stderr, "testenv: %v: control plane stopped\n", s)
		os.Exit(1)
	}()

	code := m.Run()
	signal.Stop(sigs)
	stopShared()
	os.Exit(code)
}

// Get returns the test binary's control plane, starting it on first use. It
// skips the test under -short and fails it when the control plane cannot
// start (for example when hack/testenv.sh has not built the binaries). Get
// requires Main to run the tests.
func Get(t testing.TB) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs the local control plane (run without -short)")
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		shared.env, shared.err = Start(ctx, shared.opts)
		if shared.err == nil {
			fmt.Fprintf(os.Stderr, "testenv: control plane ready in %v (%s)\n", time.Since(start).Round(10*time.Millisecond), shared.env.Dir())
		}
	})
	if shared.err != nil {
		t.Fatalf("local control plane: %v", shared.err)
	}
	if err := shared.env.Healthy(); err != nil {
		t.Fatalf("local control plane died: %v", err)
	}
	return shared.env
}

func stopShared() {
	// Wait for a start in progress, or make sure none begins after this.
	shared.once.Do(func() {})
	if shared.env != nil {
		shared.env.Stop()
	}
}
