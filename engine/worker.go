package engine

import (
	"context"
	"errors"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// A rule's workers each run processNext until the queue shuts down: the
// worker step as client-go's controllers have it. Get, defer Done; the
// gates a trigger passes before its reconcile (this replica holds its
// shard, owns the trigger, and has listed what its shard gained); the
// reconcile; then settle decides, in one place, whether the key is
// forgotten, retried with backoff or looked at again later.

// idle reports whether nothing is queued or being reconciled.
func (l *ruleLoop) idle() bool { return l.queue.Len() == 0 && l.inFlight.Load() == 0 }

// processNext takes one key from the queue and works on it; false once
// the queue has shut down.
func (l *ruleLoop) processNext(ctx context.Context) bool {
	key, shutdown := l.queue.Get()
	if shutdown {
		return false
	}
	// Counted from the moment it leaves the queue until Done has put it
	// back if it was queued again meanwhile: idle is never true between.
	l.inFlight.Add(1)
	defer l.inFlight.Add(-1)
	defer l.queue.Done(key)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("trigger", key.String())
	after, err := l.work(klog.NewContext(ctx, logger), key, cancel)
	l.settle(logger, key, after, err)
	return true
}

// work passes key through the gates and reconciles it. after > 0 asks
// for key to be looked at again then (a gate closed for now); err is the
// reconcile's. A panic outside the reconcile — which contains its own —
// is contained here, as an error: the key is not lost.
func (l *ruleLoop) work(ctx context.Context, key cache.ObjectName, cancel context.CancelFunc) (after time.Duration, err error) {
	defer func() {
		if v := recover(); v != nil {
			after, err = 0, contained(klog.FromContext(ctx), l.e.metrics, l.rule.Name, PanicReconcile, v)
		}
	}()
	if !l.e.held() {
		return holdWait, nil
	}
	d := TriggerDigest(key)
	if !l.begin(d, cancel) {
		// Queued before this replica's shard lost it: its new owner
		// reconciles it.
		return 0, nil
	}
	defer l.end(d)
	if !l.complete() {
		// The shard gained triggers a moment ago, and the informers have
		// not listed them yet: what the caches lack may exist.
		l.holds.Add(1)
		return holdWait, nil
	}
	start := time.Now()
	err = l.reconcilerFor(key).reconcile(ctx, key)
	result := ResultSuccess
	if err != nil {
		result = ResultError
	}
	l.e.metrics.ReconcileDone(l.rule.Name, result, time.Since(start))
	l.reconciles.Add(1)
	return 0, err
}

// settle is what becomes of key after work: looked at again after a
// while, forgotten (done, terminal, or out of retries), or retried with
// backoff — while this replica still owns it.
func (l *ruleLoop) settle(logger klog.Logger, key cache.ObjectName, after time.Duration, err error) {
	switch {
	case after > 0:
		l.queue.AddAfter(key, after)
	case err == nil:
		l.queue.Forget(key)
	case isTerminal(err):
		logger.Error(err, "Reconcile failed; not retried until the trigger, what it reads or the rule changes")
		l.queue.Forget(key)
	case l.rule.MaxRetries > 0 && l.queue.NumRequeues(key) >= l.rule.MaxRetries-1:
		logger.Error(err, "Giving up on trigger after retries", "retries", l.rule.MaxRetries)
		l.queue.Forget(key)
	default:
		logger.Error(err, "Reconcile failed, retrying with backoff")
		if l.e.owns(l.rule.Name, key) {
			l.queue.AddRateLimited(key)
		}
	}
}

// terminalError is a failure a retry cannot mend: the same trigger,
// lookups and rule fail the same way (controller-runtime's
// TerminalError). Its trigger is not retried with backoff; it is
// reconciled again when one of those changes, or at the resync.
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// terminal marks err as a failure no retry mends.
func terminal(err error) error { return &terminalError{err: err} }

// isTerminal reports whether err is terminal: marked so, or wrapping or
// joining only terminal errors (one that a retry may mend retries all).
func isTerminal(err error) bool {
	switch e := err.(type) {
	case nil:
		return false
	case *terminalError:
		return true
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		for _, x := range errs {
			if !isTerminal(x) {
				return false
			}
		}
		return len(errs) > 0
	}
	return isTerminal(errors.Unwrap(err))
}
