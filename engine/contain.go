package engine

import (
	"context"
	"errors"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/internal/panics"
)

// Where a panic was contained (Metrics.Panicked): each is a unit of work
// that a panic fails alone, never the process — which would crash-loop on
// the object that caused it, every rule with it.
const (
	// PanicReconcile: one trigger's reconcile — render, CEL, apply,
	// prune, release, status. The trigger fails (a Failed Event) and is
	// retried with backoff, as for any error.
	PanicReconcile = "reconcile"
	// PanicHandler: an informer's event handler. The event's trigger is
	// queued anyway where it can be told, so that its reconcile reports.
	PanicHandler = "handler"
	// PanicLoop: a step of a rule's loop (sweep, resync, a shard change)
	// or its start; a rule that cannot start is failed until it changes.
	PanicLoop = "loop"
	// PanicRollout: the rollout coordinator; the rollout halts.
	PanicRollout = "rollout"
)

// contained reports a panic recovered at where, in a unit of work of
// rule: its stack to the log, syncloop_panics_total. It returns the panic
// as an error; v is what recover returned, and contained must be called
// from the deferred function that recovered it (panics.New).
func contained(logger klog.Logger, m Metrics, rule, where string, v any) *panics.Error {
	pe := panics.New(v)
	reportPanic(logger, m, rule, where, pe)
	return pe
}

// reportPanic logs and counts pe, a panic contained at where.
func reportPanic(logger klog.Logger, m Metrics, rule, where string, pe *panics.Error) {
	logger.Error(pe, "Panic contained: the unit of work failed, syncloop goes on", "rule", rule, "where", where, "stack", string(pe.Stack))
	m.Panicked(rule, where)
}

// reportPanicIn reports the panic err carries, if any: one a render
// contained itself (render.Rule returns it as its error).
func reportPanicIn(logger klog.Logger, m Metrics, rule, where string, err error) {
	if pe, ok := errors.AsType[*panics.Error](err); ok {
		reportPanic(logger, m, rule, where, pe)
	}
}

// step runs fn, one step of the loop's work, and contains a panic in it
// (PanicLoop): the step fails, the loop goes on.
func (l *ruleLoop) step(ctx context.Context, fn func(context.Context)) {
	defer func() {
		if v := recover(); v != nil {
			contained(klog.FromContext(ctx), l.e.metrics, l.rule.Name, PanicLoop, v)
		}
	}()
	fn(ctx)
}

// containedHandler calls an informer's event handler and contains a panic
// in it (PanicHandler). The informer's goroutine, shared by every rule
// that watches the kind, goes on; when the event's object can be told,
// queued is called with it, so that what the handler would have queued
// is reconciled (and a reconcile that panics on it reports it).
type containedHandler struct {
	l      *ruleLoop
	logger klog.Logger
	h      cache.ResourceEventHandler
	queued func(obj any) // nil: nothing to queue
}

func (c containedHandler) OnAdd(obj any, initial bool) {
	defer c.contain(obj)
	c.h.OnAdd(obj, initial)
}

func (c containedHandler) OnUpdate(old, obj any) {
	defer c.contain(obj)
	c.h.OnUpdate(old, obj)
}

func (c containedHandler) OnDelete(obj any) {
	defer c.contain(obj)
	c.h.OnDelete(obj)
}

func (c containedHandler) contain(obj any) {
	v := recover()
	if v == nil {
		return
	}
	contained(c.logger, c.l.e.metrics, c.l.rule.Name, PanicHandler, v)
	if c.queued != nil {
		defer func() { _ = recover() }() // counted once: what failed may fail again here
		c.queued(obj)
	}
}
