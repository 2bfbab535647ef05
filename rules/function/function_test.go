package function

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	probeOnce sync.Once
	probeWasm []byte
	probeErr  error
)

// probe is testdata/probe compiled for wasip1 by Go itself, once per test
// process.
func probe(t *testing.T) []byte {
	t.Helper()
	probeOnce.Do(func() {
		out := filepath.Join(os.TempDir(), "syncloop-function-probe.wasm")
		cmd := exec.Command("go", "build", "-o", out, "./testdata/probe")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if got, err := cmd.CombinedOutput(); err != nil {
			probeErr = errors.New(string(got))
			return
		}
		probeWasm, probeErr = os.ReadFile(out)
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeWasm
}

func compileProbe(t *testing.T, memory int64) *Module {
	t.Helper()
	if testing.Short() {
		t.Skip("compiles a Go program to WebAssembly")
	}
	rt, err := NewRuntime(t.Context(), memory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	m, err := rt.Compile(t.Context(), probe(t))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := rt.Compile(t.Context(), probe(t)); again != m {
		t.Error("the same module was compiled twice")
	}
	return m
}

// TestCall: stdin in, stdout out, stderr kept; the clock is a fake, so a
// call's output depends on its input alone; each failure says what it
// was, and a call after one works.
func TestCall(t *testing.T) {
	m := compileProbe(t, DefaultMemory)
	limits := Limits{Timeout: 30 * time.Second, Output: 1 << 16} // generous: the race detector slows a start
	res, err := m.Call(t.Context(), []byte(`{"do":"echo","name":"web"}`), limits)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := m.Call(t.Context(), []byte(`{"do":"echo","name":"web"}`), limits)
	if !strings.HasPrefix(string(res.Stdout), `{"at":`) || !strings.Contains(string(res.Stdout), `"calls":1,"hello":"web"`) ||
		string(again.Stdout) != string(res.Stdout) || string(res.Stderr) != "echoing web\n" {
		t.Errorf("echo: stdout %q then %q, stderr %q; want the same greeting twice", res.Stdout, again.Stdout, res.Stderr)
	}

	for _, c := range []struct{ do, want string }{
		{"exit", "exited with code 3 (stderr: giving up: no such thing)"},
		{"trap", "exited with code 2 (stderr: panic: assignment to entry in nil map)"}, // Go's runtime turns a panic into exit 2
		{"loop", "ran longer than its time limit of 300ms: stopped"},
		{"spew", "wrote more than its output limit of 65536 bytes"},
	} {
		l := limits
		if c.do == "loop" {
			l.Timeout = 300 * time.Millisecond
		}
		_, err := m.Call(t.Context(), []byte(`{"do":"`+c.do+`"}`), l)
		var ce *CallError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a CallError saying %q", c.do, err, c.want)
		}
	}
	if res, err := m.Call(t.Context(), []byte(`{"do":"echo","name":"after"}`), limits); err != nil || !strings.Contains(string(res.Stdout), "after") {
		t.Errorf("a call after the failures: %v, %q", err, res.Stdout)
	}
}

// TestMemoryLimit: a module that allocates without bound fails when it
// reaches the runtime's memory limit, not the machine's.
func TestMemoryLimit(t *testing.T) {
	m := compileProbe(t, 64<<20)
	_, err := m.Call(t.Context(), []byte(`{"do":"alloc"}`), Limits{Timeout: 30 * time.Second, Output: 1 << 16})
	var ce *CallError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "(stderr: runtime: out of memory") {
		t.Errorf("alloc: %v, want a CallError saying out of memory", err)
	}
}

// TestModules: bytes that are not a module, and a module without _start,
// are refused at compile time; a module that executes unreachable traps.
func TestModules(t *testing.T) {
	rt, err := NewRuntime(t.Context(), DefaultMemory)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(context.Background())
	if _, err := rt.Compile(t.Context(), []byte("not wasm")); err == nil || !strings.Contains(err.Error(), "not a WebAssembly module") {
		t.Errorf("garbage: %v", err)
	}
	// The smallest valid module: magic and version, nothing exported.
	if _, err := rt.Compile(t.Context(), []byte{0, 'a', 's', 'm', 1, 0, 0, 0}); err == nil || !strings.Contains(err.Error(), "exports no _start") {
		t.Errorf("a module without _start: %v", err)
	}
	unreachable := []byte{0, 'a', 's', 'm', 1, 0, 0, 0,
		0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: func() → ()
		0x03, 0x02, 0x01, 0x00, // function 0 of that type
		0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00, // exported as _start
		0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b, // its body: unreachable
	}
	m, err := rt.Compile(t.Context(), unreachable)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.Call(t.Context(), []byte("{}"), DefaultLimits)
	if err == nil || !strings.HasPrefix(err.Error(), "trapped: wasm error: unreachable") {
		t.Errorf("unreachable: %v, want a trap", err)
	}
}

// TestServe: a serving module answers call after call from one instance
// (its count goes on), with each call's stderr; a call that fails stops
// its instance, and the next call starts a fresh one.
func TestServe(t *testing.T) {
	m := compileProbe(t, DefaultMemory)
	limits := Limits{Timeout: 30 * time.Second, Output: 1 << 16} // generous: the race detector slows a start
	echo := func(name string) (string, string) {
		t.Helper()
		res, err := m.Serve(t.Context(), []byte(`{"do":"echo","name":"`+name+`"}`), limits)
		if err != nil {
			t.Fatal(err)
		}
		return string(res.Stdout), string(res.Stderr)
	}
	out, stderr := echo("a")
	if !strings.Contains(out, `"calls":1,"hello":"a"`) || stderr != "echoing a\n" {
		t.Errorf("first call: %q, stderr %q", out, stderr)
	}
	if out, stderr = echo("b"); !strings.Contains(out, `"calls":2,"hello":"b"`) || stderr != "echoing b\n" {
		t.Errorf("second call, the instance kept: %q, stderr %q", out, stderr)
	}
	for _, c := range []struct{ do, want string }{
		{"exit", "exited while serving: exited with code 3 (stderr: giving up: no such thing)"},
		{"loop", "ran longer than its time limit of 300ms: stopped"},
		{"spew", "wrote more than its output limit of 65536 bytes"},
	} {
		l := limits
		if c.do == "loop" {
			l.Timeout = 300 * time.Millisecond
		}
		_, err := m.Serve(t.Context(), []byte(`{"do":"`+c.do+`"}`), l)
		var ce *CallError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want a CallError saying %q", c.do, err, c.want)
		}
		if out, _ := echo("after"); !strings.Contains(out, `"calls":1,`) {
			t.Errorf("after %s: %q, want a fresh instance", c.do, out)
		}
	}
	if _, err := m.Serve(t.Context(), []byte("{\n}"), limits); err == nil {
		t.Error("an input of two lines was sent")
	}
}

// BenchmarkServe measures one call of a Go module that serves: what a
// function step costs per child rendered once its instance runs.
func BenchmarkServe(b *testing.B) {
	rt, err := NewRuntime(b.Context(), DefaultMemory)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(context.Background())
	m, err := rt.Compile(b.Context(), probe(&testing.T{}))
	if err != nil {
		b.Fatal(err)
	}
	input := []byte(`{"do":"echo","name":"web"}`)
	for b.Loop() {
		if _, err := m.Serve(b.Context(), input, DefaultLimits); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCall measures one call of a Go module from a fresh instance:
// what a function step costs per child rendered.
func BenchmarkCall(b *testing.B) {
	rt, err := NewRuntime(b.Context(), DefaultMemory)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(context.Background())
	t := &testing.T{}
	wasm := probe(t)
	m, err := rt.Compile(b.Context(), wasm)
	if err != nil {
		b.Fatal(err)
	}
	input := []byte(`{"do":"echo","name":"web"}`)
	for b.Loop() {
		if _, err := m.Call(b.Context(), input, DefaultLimits); err != nil {
			b.Fatal(err)
		}
	}
}
