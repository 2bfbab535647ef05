package function

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/internal/panics"
)

// Serving: a module that opts in stays up between calls. Started with
// SYNCLOOP_FUNCTION_MODE=serve in its environment, it reads one request
// per line on stdin and writes one response per line on stdout, until
// stdin ends — the same JSON as a fresh call's, without the start of the
// module's runtime (most of a Go module's call). An instance serves one
// call at a time; a module keeps up to its runtime's slots of them, each
// closed once idle for idleTTL, or at once when a call on it fails.

// ServeEnv is the variable, and ServeMode its value, a serving module is
// started with.
const (
	ServeEnv  = "SYNCLOOP_FUNCTION_MODE"
	ServeMode = "serve"
)

// idleTTL is how long an idle instance is kept.
const idleTTL = 30 * time.Second

// pool is a module's instances that serve.
type pool struct {
	mu    sync.Mutex
	idle  []*instance
	armed bool // a reap is due
}

// instance is one running instance of a serving module.
type instance struct {
	in     *io.PipeWriter
	out    *bufio.Reader
	stderr *lockedTail
	cancel context.CancelFunc
	exited chan struct{} // closed when the module returned
	err    error         // why it returned (after exited)
	used   time.Time
}

// Serve is Call for a module that serves: input is sent to an instance
// kept up between calls (started if none is idle), as one line.
func (m *Module) Serve(ctx context.Context, input []byte, limits Limits) (Result, error) {
	if bytes.IndexByte(input, '\n') >= 0 {
		return Result{}, errors.New("a served call's input must be one line (compact JSON)")
	}
	if m.closed.Load() {
		return Result{}, &CallError{Why: errClosed.Error(), Err: errClosed}
	}
	select {
	case m.r.slots <- struct{}{}:
		defer func() { <-m.r.slots }()
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	inst, err := m.take()
	if err != nil {
		return Result{}, err
	}
	out, err := inst.call(ctx, input, limits)
	res := Result{Stdout: out, Stderr: inst.stderr.take()}
	if err != nil {
		inst.stop()
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		return res, &CallError{Why: err.Error(), Stderr: res.Stderr, Err: err}
	}
	m.put(inst)
	return res, nil
}

// take is an idle instance, or a new one.
func (m *Module) take() (*instance, error) {
	p := &m.pool
	p.mu.Lock()
	for len(p.idle) > 0 {
		inst := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		select {
		case <-inst.exited:
			continue // it ended between calls
		default:
		}
		p.mu.Unlock()
		return inst, nil
	}
	p.mu.Unlock()
	return m.start()
}

// put keeps inst for the next call; the instances idle for longer than
// idleTTL are closed by a reaper, armed while any is idle.
func (m *Module) put(inst *instance) {
	p := &m.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if m.closed.Load() { // Close set it before it took the idle
		inst.stop()
		return
	}
	inst.used = time.Now()
	p.idle = append(p.idle, inst)
	if !p.armed {
		p.armed = true
		time.AfterFunc(idleTTL, m.reap)
	}
}

// reap closes the instances idle for longer than idleTTL. It runs on a
// timer's goroutine, which no caller joins: a panic in it is logged and
// the reaper disarmed (the next put arms it again), never the process'.
func (m *Module) reap() {
	p := &m.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() {
		if v := recover(); v != nil {
			p.armed = false
			pe := panics.New(v)
			klog.Background().Error(pe, "Panic contained: idle function instances were not reaped", "where", "function", "stack", string(pe.Stack))
		}
	}()
	keep := p.idle[:0]
	for _, i := range p.idle {
		if time.Since(i.used) >= idleTTL {
			i.stop()
			continue
		}
		keep = append(keep, i)
	}
	p.idle = keep
	p.armed = len(keep) > 0
	if p.armed {
		time.AfterFunc(idleTTL, m.reap)
	}
}

// stopIdle stops m's idle instances and waits until they have exited.
func (m *Module) stopIdle() {
	p := &m.pool
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, i := range idle {
		i.stop()
		<-i.exited
	}
}

// start starts an instance of m that serves.
func (m *Module) start() (*instance, error) {
	ctx, cancel := context.WithCancel(context.Background())
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	inst := &instance{in: inW, out: bufio.NewReaderSize(outR, 64<<10), stderr: &lockedTail{t: tail{max: maxStderr}},
		cancel: cancel, exited: make(chan struct{})}
	cfg := wazero.NewModuleConfig().WithName("").WithArgs("function").WithEnv(ServeEnv, ServeMode).
		WithStdin(inR).WithStdout(outW).WithStderr(inst.stderr)
	go func() {
		defer close(inst.exited)
		inst.err = m.run(ctx, cfg) // a panic in it ends the instance, and fails its call
		_ = outW.CloseWithError(errExited)
		_ = inR.Close()
	}()
	return inst, nil
}

var errExited = errors.New("the module exited")

// call sends input and reads the response line, within limits.
func (i *instance) call(ctx context.Context, input []byte, limits Limits) ([]byte, error) {
	type answer struct {
		line []byte
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		defer func() { done <- a }()
		defer panics.Recover(&a.err)
		if _, a.err = i.in.Write(append(input, '\n')); a.err == nil {
			a.line, a.err = readLine(i.out, limits.Output)
		}
	}()
	timer := time.NewTimer(limits.Timeout)
	defer timer.Stop()
	select {
	case a := <-done:
		if errors.Is(a.err, errExited) || errors.Is(a.err, io.ErrClosedPipe) {
			<-i.exited
			if errors.As(i.err, new(*panics.Error)) || errors.Is(i.err, errClosed) {
				return nil, fmt.Errorf("exited while serving: %w", i.err)
			}
			return nil, fmt.Errorf("exited while serving: %s", exitWhy(i.err))
		}
		return a.line, a.err
	case <-timer.C:
		return nil, fmt.Errorf("ran longer than its time limit of %s: stopped", limits.Timeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// stop stops the instance.
func (i *instance) stop() {
	i.cancel()
	_ = i.in.Close()
}

// readLine reads one line of at most max bytes, without its newline.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max+1 {
			return nil, fmt.Errorf("wrote more than its output limit of %d bytes", max)
		}
		switch {
		case err == nil:
			return bytes.TrimSuffix(line, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// lockedTail is a tail written by the module and read between calls.
type lockedTail struct {
	mu sync.Mutex
	t  tail
}

func (l *lockedTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.t.Write(p)
}

// take returns what was written since the last take.
func (l *lockedTail) take() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]byte(nil), l.t.bytes()...)
	l.t.buf = l.t.buf[:0]
	return out
}
