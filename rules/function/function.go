// Package function runs the code a rule calls when YAML is not enough:
// webhooks (webhook.go), and WebAssembly modules in the WASI command convention — the input as JSON on
// stdin, the output as JSON on stdout, diagnostics on stderr, a non-zero
// exit a failure — in process, with wazero (pure Go).
//
// A call is sandboxed and bounded: no filesystem, no network, a clock and
// a random source that are fakes (deterministic: what a call returns
// depends on its input and the module alone, so that render, test and plan
// run a function offline exactly as run does), memory capped, tables
// bounded (tables.go), and a deadline past which the call is stopped. The
// stack wazero runs a call's WebAssembly frames on is its own, outside the
// memory cap and with no option to bound it: it doubles as it fills, and a
// call that would take it past wazero's ceiling (50 MB, so at most some
// 84 MB, 160 MiB allocated in all) traps with a stack overflow, failing
// that call alone; at most two calls per CPU run at once. A module is
// compiled once per content and runtime. The package knows nothing of
// rules or Kubernetes objects: bytes in, bytes out.
package function

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/syncloop/syncloop/internal/panics"
)

// Limits bound each call of a module. (What memory a module may have is
// the Runtime's.)
type Limits struct {
	// Timeout is how long a call may run; it is stopped past it.
	Timeout time.Duration
	// Output is the most a call may write to stdout, in bytes.
	Output int
}

// DefaultLimits are a call's limits unless a rule says otherwise.
var DefaultLimits = Limits{Timeout: 2 * time.Second, Output: 16 << 20}

// DefaultMemory is the most linear memory a module may have: 256 MiB.
const DefaultMemory = 256 << 20

// maxStderr is how much of a call's stderr is kept: its end.
const maxStderr = 8 << 10

// Runtime compiles and runs modules. Safe for concurrent use: at most
// two calls per CPU run at once (a call is CPU-bound, and each instance
// holds its own memory); the others wait their turn.
type Runtime struct {
	rt    wazero.Runtime
	slots chan struct{}
	// instantiate is rt.InstantiateModule (a test makes it panic).
	instantiate func(context.Context, wazero.CompiledModule, wazero.ModuleConfig) (api.Module, error)

	mu      sync.Mutex
	modules map[[sha256.Size]byte]*Module
}

// NewRuntime makes a runtime whose modules may have at most memory bytes
// of linear memory (rounded down to 64 KiB pages; a module that grows past
// it fails). Close releases it.
func NewRuntime(ctx context.Context, memory int64) (*Runtime, error) {
	cfg := wazero.NewRuntimeConfig().
		WithCloseOnContextDone(true). // a call past its deadline is stopped, loops included
		WithMemoryLimitPages(uint32(max(memory/65536, 1)))
	rt := wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		_ = rt.Close(ctx)
		return nil, err
	}
	return &Runtime{rt: rt, slots: make(chan struct{}, 2*runtime.GOMAXPROCS(0)), instantiate: rt.InstantiateModule,
		modules: map[[sha256.Size]byte]*Module{}}, nil
}

// Close stops the instances that serve, idle, and releases the runtime
// and its compiled modules. No call may be under way.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	for _, m := range r.modules {
		m.stopIdle()
	}
	r.mu.Unlock()
	return r.rt.Close(ctx)
}

// Module is a compiled module.
type Module struct {
	r        *Runtime
	compiled wazero.CompiledModule
	pool     pool // instances that serve (Serve)
	// Digest is the sha256 of the module's bytes.
	Digest [sha256.Size]byte
	closed atomic.Bool
}

// Compile compiles wasm, once per content: a module compiled before, and
// not closed since, is returned again. It fails on a module that is not a
// WASI command (one whose entry point is _start), and on one whose tables
// cannot be bounded (tables.go).
func (r *Runtime) Compile(ctx context.Context, wasm []byte) (*Module, error) {
	digest := sha256.Sum256(wasm)
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.modules[digest]; ok {
		return m, nil
	}
	bounded, err := boundTables(wasm)
	if err != nil && !errors.Is(err, errUnreadable) {
		return nil, fmt.Errorf("tables: %w", err)
	}
	if err != nil {
		bounded = wasm // for the compiler to say what is wrong with it
	}
	compiled, cerr := r.rt.CompileModule(ctx, bounded)
	switch {
	case cerr != nil:
		return nil, fmt.Errorf("not a WebAssembly module wazero can compile: %w", cerr)
	case err != nil:
		_ = compiled.Close(ctx)
		return nil, fmt.Errorf("tables: %w", err)
	}
	if _, ok := compiled.ExportedFunctions()["_start"]; !ok {
		_ = compiled.Close(ctx)
		return nil, errors.New("not a WASI command: it exports no _start (build it as a program, e.g. GOOS=wasip1 GOARCH=wasm go build)")
	}
	m := &Module{r: r, compiled: compiled, Digest: digest}
	r.modules[digest] = m
	return m, nil
}

// errClosed is a call of a module closed since it was compiled.
var errClosed = errors.New("the module was closed: no rule in force calls it")

// Close stops m's idle instances and releases its compiled code; a
// later Compile of the same bytes compiles them anew. Calls under way
// finish; a call made after Close fails. Whoever holds m must no longer
// call it: the rules loader closes the modules no rule in force names.
func (m *Module) Close(ctx context.Context) error {
	if m.closed.Swap(true) {
		return nil
	}
	m.r.mu.Lock()
	if m.r.modules[m.Digest] == m {
		delete(m.r.modules, m.Digest)
	}
	m.r.mu.Unlock()
	m.stopIdle()
	return m.compiled.Close(ctx)
}

// Result is what a call wrote.
type Result struct {
	// Stdout is the call's output; Stderr the end of its diagnostics.
	Stdout, Stderr []byte
}

// CallError is a call that failed: the module trapped, exited non-zero,
// ran out of time or memory, or wrote too much.
type CallError struct {
	// Why says how it failed; Stderr is the end of what it wrote there.
	Why    string
	Stderr []byte
	Err    error
}

func (e *CallError) Error() string {
	// The first line says most: a message, or Go's "panic: …" or
	// "fatal error: out of memory" before its stacks.
	if first, _, _ := bytes.Cut(bytes.TrimSpace(e.Stderr), []byte("\n")); len(first) > 0 {
		return fmt.Sprintf("%s (stderr: %s)", e.Why, first)
	}
	return e.Why
}

func (e *CallError) Unwrap() error { return e.Err }

// Call runs the module once, from a fresh instance, with input on stdin,
// within limits (its time from when its turn comes). An error is a
// *CallError, or ctx's when ctx ended first.
//
// A module that writes more than limits.Output fails with that limit
// however it ends (one that takes no notice of its failed writes and
// exits non-zero, say); a panic in running it fails the call, as a
// *CallError wrapping the *panics.Error.
func (m *Module) Call(ctx context.Context, input []byte, limits Limits) (Result, error) {
	select {
	case m.r.slots <- struct{}{}:
		defer func() { <-m.r.slots }()
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	callCtx, cancel := context.WithTimeout(ctx, limits.Timeout)
	defer cancel()
	stdout := &capped{max: limits.Output}
	stderr := &tail{max: maxStderr}
	cfg := wazero.NewModuleConfig().WithName("").WithArgs("function").
		WithStdin(bytes.NewReader(input)).WithStdout(stdout).WithStderr(stderr)
	err := m.run(callCtx, cfg)
	res := Result{Stdout: stdout.buf.Bytes(), Stderr: stderr.bytes()}
	var exit *sys.ExitError
	var pe *panics.Error
	switch {
	case ctx.Err() != nil:
		return res, ctx.Err()
	case stdout.over:
		return res, &CallError{Why: fmt.Sprintf("wrote more than its output limit of %d bytes", limits.Output), Stderr: res.Stderr}
	case err == nil, errors.As(err, &exit) && exit.ExitCode() == 0:
		return res, nil
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded:
		return res, &CallError{Why: fmt.Sprintf("ran longer than its time limit of %s: stopped", limits.Timeout), Stderr: res.Stderr, Err: err}
	case errors.As(err, &pe), errors.Is(err, errClosed):
		return res, &CallError{Why: err.Error(), Stderr: res.Stderr, Err: err}
	}
	return res, &CallError{Why: exitWhy(err), Stderr: res.Stderr, Err: err}
}

// run instantiates m with cfg, which runs it to its end, and closes the
// instance; a panic in it is returned as a *panics.Error.
func (m *Module) run(ctx context.Context, cfg wazero.ModuleConfig) (err error) {
	defer panics.Recover(&err)
	if m.closed.Load() {
		return errClosed
	}
	mod, err := m.r.instantiate(ctx, m.compiled, cfg)
	if mod != nil {
		_ = mod.Close(context.WithoutCancel(ctx))
	}
	return err
}

// exitWhy says how a module that returned err ended: its exit code, or
// its trap.
func exitWhy(err error) string {
	var exit *sys.ExitError
	switch {
	case err == nil:
		return "exited with code 0"
	case errors.As(err, &exit):
		return fmt.Sprintf("exited with code %d", exit.ExitCode())
	}
	return "trapped: " + trapMessage(err)
}

// trapMessage is what a trap's error says, without the module's stack
// and name wazero adds: "wasm error: unreachable".
func trapMessage(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	if i := strings.Index(msg, "wasm error: "); i >= 0 {
		msg = msg[i:]
	}
	return msg
}

// capped keeps up to max bytes and notes whether more came.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if c.buf.Len()+len(p) > c.max {
		c.over = true
		return 0, errors.New("output limit reached")
	}
	return c.buf.Write(p)
}

// tail keeps the last max bytes written.
type tail struct {
	buf []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) bytes() []byte {
	if len(t.buf) > t.max {
		return t.buf[len(t.buf)-t.max:]
	}
	return t.buf
}
