package function

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/syncloop/syncloop/internal/panics"
)

// newRuntime is a runtime of DefaultMemory, closed with the test.
func newRuntime(t *testing.T) *Runtime {
	t.Helper()
	rt, err := NewRuntime(t.Context(), DefaultMemory)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.Close(context.Background()) })
	return rt
}

// hangGuard is a generous deadline for a call that must end well within
// it: it only keeps a broken bound from hanging the test.
var hangGuard = Limits{Timeout: time.Minute, Output: 1 << 20}

// TestTableGrowBounded: a table declared without a maximum, or with one
// above MaxTableElements, cannot grow past MaxTableElements: table.grow
// returns -1 (the module below exits then, and traps if the grow
// succeeds) instead of allocating 8 bytes a reference in one host call no
// deadline stops — 600 million took 17 s and 4.7 GB. Up to the bound, a
// grow still succeeds.
func TestTableGrowBounded(t *testing.T) {
	rt := newRuntime(t)
	for _, c := range []struct {
		name  string
		wasm  []byte
		grows bool
	}{
		{"past the bound, no maximum declared", growModule(MaxTableElements, table(1, -1)), false},
		{"600 million, no maximum declared", growModule(600_000_000, table(1, -1)), false},
		{"past the bound, the largest maximum declared", growModule(MaxTableElements, table(1, 1<<32-1)), false},
		{"past the bound from an empty table", growModule(MaxTableElements+1, table(0, -1)), false},
		{"to the bound", growModule(MaxTableElements-1, table(1, -1)), true},
		{"past a smaller maximum declared", growModule(10, table(1, 10)), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := rt.Compile(t.Context(), c.wasm)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = m.Call(t.Context(), nil, hangGuard)
			runtime.ReadMemStats(&after)
			switch {
			case c.grows && (err == nil || !strings.Contains(err.Error(), "unreachable")):
				t.Errorf("got %v, want the grow to succeed (and the module to trap)", err)
			case !c.grows && err != nil:
				t.Errorf("got %v, want the grow refused", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 4*8*MaxTableElements {
				t.Errorf("the call allocated %d MiB, more than a table of %d references", grew>>20, MaxTableElements)
			}
		})
	}
}

// TestTablesRefused: a module whose table holds more than
// MaxTableElements from the start, or that declares more than MaxTables
// tables, is refused at compile time, saying why; no call of it runs.
func TestTablesRefused(t *testing.T) {
	rt := newRuntime(t)
	many := make([][]byte, MaxTables+1)
	for i := range many {
		many[i] = table(1, -1)
	}
	for wasm, want := range map[string]string{
		string(growModule(1, table(MaxTableElements+1, -1))):  "tables: its table 0 holds 1048577 references from the start, more than the 1048576 a table may have",
		string(growModule(1, table(1<<32-1, 1<<32-1))):        "tables: its table 0 holds 4294967295 references from the start",
		string(growModule(1, many...)):                        "tables: it declares 5 tables, more than the 4 a module may have",
		string(growModule(1, []byte{0x70, 0x03, 0x01, 0x01})): "tables: its table 0 has limits syncloop cannot bound (flags 0x03)",
		string(growModule(1, []byte{0x63, 0x70, 0x00, 0x01})): "tables: its table 0 holds references of a type syncloop cannot bound (0x63)",
	} {
		if _, err := rt.Compile(t.Context(), []byte(wasm)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	}
}

// TestBoundTables: boundTables changes the limits of the tables, and
// nothing else of the module.
func TestBoundTables(t *testing.T) {
	wasm := growModule(1, table(3, -1), cat([]byte{externref, 0x01}, uleb(2), uleb(1<<31)), table(0, 7))
	got, err := boundTables(wasm)
	if err != nil {
		t.Fatal(err)
	}
	want := growModule(1, table(3, MaxTableElements), cat([]byte{externref, 0x01}, uleb(2), uleb(MaxTableElements)), table(0, 7))
	if !bytes.Equal(got, want) {
		t.Errorf("got\n%x\nwant\n%x", got, want)
	}
	noTables := recurseModule()
	if got, err := boundTables(noTables); err != nil || !bytes.Equal(got, noTables) {
		t.Errorf("a module without tables: %v, changed: %v", err, !bytes.Equal(got, noTables))
	}
	for _, bad := range [][]byte{
		[]byte("\x00asm\x01\x00\x00\x00\x04\xff"),                 // a section's size cut short
		[]byte("\x00asm\x01\x00\x00\x00\x04\x05\x01\x70\x00"),     // longer than the module
		[]byte("\x00asm\x01\x00\x00\x00\x04\x03\x01\x70\x00\x01"), // a table cut short (size 3, 4 bytes of table)
	} {
		if _, err := boundTables(bad); !errors.Is(err, errUnreadable) {
			t.Errorf("%x: %v, want unreadable", bad, err)
		}
	}
}

// TestRecursionFailsItsCall: a module that recurses without end fails
// its call alone, when wazero's stack reaches its ceiling, not the
// machine's memory: the call allocates less than 256 MiB (160 MiB
// measured: wazero's stack, outside the memory cap, doubles up to some
// 84 MB), and the module can be called again.
func TestRecursionFailsItsCall(t *testing.T) {
	rt := newRuntime(t)
	m, err := rt.Compile(t.Context(), recurseModule())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := m.Call(t.Context(), nil, hangGuard)
		runtime.ReadMemStats(&after)
		if ce, ok := errors.AsType[*CallError](err); !ok || !strings.Contains(ce.Error(), "stack overflow") {
			t.Fatalf("got %v, want a CallError saying stack overflow", err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<20 {
			t.Errorf("the call allocated %d MiB", grew>>20)
		}
	}
}

// TestOutputLimitNamed: a module that writes past its output limit fails
// with that limit, however it ends — one that takes no notice of its
// failed writes and exits 1 too — and no more than the limit is kept. (A
// served call reads one line of at most the limit: TestServe.)
func TestOutputLimitNamed(t *testing.T) {
	m, err := newRuntime(t).Compile(t.Context(), spewModule(100)) // 6.25 MiB
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Call(t.Context(), []byte("{}"), hangGuard)
	if ce, ok := errors.AsType[*CallError](err); !ok || !strings.Contains(ce.Error(), "wrote more than its output limit of 1048576 bytes") {
		t.Errorf("got %v, want the output limit", err)
	}
	if len(res.Stdout) > hangGuard.Output {
		t.Errorf("kept %d bytes of output", len(res.Stdout))
	}
}

// TestPanicContained: a panic while a module runs — in wazero, say, on
// the call's goroutine or the one a served instance runs on — fails that
// call, as a *CallError wrapping the *panics.Error (the engine counts it
// and reports the trigger Failed), and gives its slot back: calls after
// it run.
func TestPanicContained(t *testing.T) {
	m := compileProbe(t, DefaultMemory)
	limits := Limits{Timeout: 30 * time.Second, Output: 1 << 16}
	instantiate := m.r.instantiate
	defer func() { m.r.instantiate = instantiate }()
	for how, call := range map[string]func(context.Context, []byte, Limits) (Result, error){"fresh": m.Call, "served": m.Serve} {
		m.r.instantiate = func(context.Context, wazero.CompiledModule, wazero.ModuleConfig) (api.Module, error) {
			panic("wazero broke")
		}
		for range cap(m.r.slots) + 1 { // more than the slots: each is given back
			_, err := call(t.Context(), []byte(`{"do":"echo","name":"x"}`), limits)
			pe, ok := errors.AsType[*panics.Error](err)
			if _, call := errors.AsType[*CallError](err); !ok || !call || pe.Value != "wazero broke" {
				t.Fatalf("%s: got %v, want a CallError wrapping the panic", how, err)
			}
		}
		m.r.instantiate = instantiate
		if res, err := call(t.Context(), []byte(`{"do":"echo","name":"after"}`), limits); err != nil || !strings.Contains(string(res.Stdout), "after") {
			t.Errorf("%s: a call after the panics: %v, %q", how, err, res.Stdout)
		}
	}
}

// TestModuleClose: a closed module cannot be called, fresh or served,
// and its idle instances are stopped; compiling its bytes again makes a
// new module that runs.
func TestModuleClose(t *testing.T) {
	m := compileProbe(t, DefaultMemory)
	limits := Limits{Timeout: 30 * time.Second, Output: 1 << 16}
	if _, err := m.Serve(t.Context(), []byte(`{"do":"echo","name":"a"}`), limits); err != nil {
		t.Fatal(err)
	}
	m.pool.mu.Lock()
	idle := append([]*instance(nil), m.pool.idle...)
	m.pool.mu.Unlock()
	if err := m.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, i := range idle {
		<-i.exited // stopped: Close waits for it
	}
	for how, call := range map[string]func(context.Context, []byte, Limits) (Result, error){"fresh": m.Call, "served": m.Serve} {
		if _, err := call(t.Context(), []byte(`{"do":"echo","name":"b"}`), limits); !errors.Is(err, errClosed) {
			t.Errorf("%s after Close: %v, want it refused", how, err)
		}
	}
	again, err := m.r.Compile(t.Context(), probe(t))
	if err != nil || again == m {
		t.Fatalf("compiled again: %v (the closed module again: %v)", err, again == m)
	}
	if res, err := again.Call(t.Context(), []byte(`{"do":"echo","name":"c"}`), limits); err != nil || !strings.Contains(string(res.Stdout), `"hello":"c"`) {
		t.Errorf("the module compiled again: %v, %q", err, res.Stdout)
	}
}
