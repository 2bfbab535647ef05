package engine

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// A loop's event handlers: what an informer event queues. A key, not the
// event, is queued (client-go's level-triggered queue: a burst of updates
// to one object is one reconcile), and only the triggers this replica's
// shard owns (add).

// handlers turn the informers' events into trigger keys.
func (l *ruleLoop) handlers(ctx context.Context) handlers { return l.handlersOf(ctx, l.rc, true) }

// handlersOf are the event handlers of rc's watches: the loop's own
// reconciler's (primary), or those of the revision a rollout moves from,
// whose trigger events — the same informer's — the primary's handle, and
// whose child informers the primary's share are skipped (subscribe).
// Each contains its panics (containedHandler).
func (l *ruleLoop) handlersOf(ctx context.Context, rc *reconciler, primary bool) handlers {
	logger := klog.FromContext(ctx)
	contain := func(h cache.ResourceEventHandler, queued func(any)) cache.ResourceEventHandler {
		return containedHandler{l: l, logger: logger, h: h, queued: queued}
	}
	trigger := cache.ResourceEventHandler(cache.ResourceEventHandlerFuncs{})
	if primary {
		trigger = contain(l.triggerHandler(), l.enqueue)
	}
	return handlers{
		trigger: trigger,
		child: contain(cache.ResourceEventHandlerFuncs{
			AddFunc:    l.childChanged,
			UpdateFunc: func(_, obj any) { l.childChanged(obj) },
			DeleteFunc: func(obj any) {
				l.forget(obj)
				l.enqueueOwner(obj)
			},
		}, l.enqueueOwner),
		lookup: func(lw *lookupWatch) cache.ResourceEventHandler {
			changed := func(objs ...any) { rc.deps.queue(lw.index, objs, l.add) }
			return contain(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(obj any) { changed(obj) },
				UpdateFunc: func(old, obj any) { changed(old, obj) },
				DeleteFunc: func(obj any) { changed(obj) },
			}, nil)
		},
		patch: func(pw *patchWatch) cache.ResourceEventHandler {
			changed := func(obj any) {
				if pw.res != nil {
					l.patchChanged(rc, pw.res.Index, obj)
				}
			}
			return contain(cache.ResourceEventHandlerFuncs{
				AddFunc:    changed,
				UpdateFunc: func(_, obj any) { changed(obj) },
				DeleteFunc: func(obj any) { l.forget(obj); changed(obj) },
			}, nil)
		},
	}
}

// triggerHandler queues the triggers the rule wants.
func (l *ruleLoop) triggerHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if l.wants(obj) {
				l.enqueue(obj)
			}
		},
		UpdateFunc: func(old, obj any) {
			// Old or new: a trigger that stops matching is reconciled
			// once more, and its children pruned.
			if l.wants(old) || l.wants(obj) {
				l.enqueue(obj)
			}
		},
		DeleteFunc: l.enqueue,
	}
}

// wants evaluates the rule's `when` for an event's object. An evaluation
// error counts as wanted: the reconcile reports it.
func (l *ruleLoop) wants(obj any) bool {
	if ro := l.ro.Load(); ro != nil && !ro.co.Settled() && wants(ro.from.rule, obj) {
		return true // during a rollout, either revision's when
	}
	return wants(l.rule, obj)
}

func wants(r *rules.Rule, obj any) bool {
	if r.Watch.When == nil {
		return true
	}
	u := wholeOf(obj)
	if u == nil {
		return true
	}
	ok, err := r.Watch.When.EvalBool(context.Background(), &expr.Activation{Object: u.Object, Rule: r.Name})
	return ok || err != nil
}

func (l *ruleLoop) enqueue(obj any) {
	key, err := cache.ObjectToName(unwrap(obj))
	if err != nil {
		return
	}
	l.add(key)
}

// unwrap is the object of a delete event's tombstone, else obj.
func unwrap(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

// enqueueOwner queues the trigger of a child of this rule (drift repair: an
// edited or deleted child is reconciled back).
func (l *ruleLoop) enqueueOwner(obj any) {
	m, err := meta.Accessor(unwrap(obj))
	if err != nil || rules.Label(m, rules.LabelRule) != l.rule.Name {
		return
	}
	if key, ok := l.ownTrigger(rules.Annotation(m, rules.AnnotationOwner)); ok {
		l.add(key)
	}
}

// childChanged queues the trigger of a child that was added or updated —
// unless the event is the echo of syncloop's own last apply of it (the
// version that apply returned), which changes nothing the reconcile that
// made it did not already see: a cold start then costs one reconcile per
// trigger, not two. An event that arrives while syncloop's own apply of
// the child is still returning is held (ownWrites.echo): the apply's end
// queues the trigger if it was not the echo.
//
// A rule's function (a sync hook) is the exception: it is given the
// children as the caches have them, so it is called again once they show
// what syncloop applied — as Metacontroller calls its hook again on every
// child's event, its own included. A call that changes nothing writes
// nothing, and makes no echo.
func (l *ruleLoop) childChanged(obj any) {
	if o, ok := obj.(object); ok && l.rule.Sync() == nil {
		for _, rc := range l.reconcilers() {
			if rc.writes.echo(refOf(o), o.GetResourceVersion()) {
				return
			}
		}
	}
	l.enqueueOwner(obj)
}

// patchChanged queues the triggers whose resource number i of rc's rule
// patches obj — unless the event is the echo of syncloop's own last apply
// of it.
func (l *ruleLoop) patchChanged(rc *reconciler, i int, obj any) {
	o, ok := asObject(obj)
	if !ok {
		return
	}
	for _, r := range l.reconcilers() {
		if r.writes.isOwnVersion(refOf(o), o.GetResourceVersion()) {
			return
		}
	}
	rc.patches.each(i, o.GetNamespace(), o.GetName(), nil, l.add)
}

// forget drops what is remembered of a written object that is gone.
func (l *ruleLoop) forget(obj any) {
	if o, ok := asObject(obj); ok {
		for _, rc := range l.reconcilers() {
			rc.writes.gone(refOf(o))
			rc.fights.gone(refOf(o))
		}
	}
}

// reconcilers are the loop's reconciler and, during a rollout, the one of
// the revision it moves from.
func (l *ruleLoop) reconcilers() []*reconciler {
	if ro := l.ro.Load(); ro != nil {
		return ro.both
	}
	return l.own
}

// reconcilerFor is the reconciler of the revision trigger key is on.
func (l *ruleLoop) reconcilerFor(key cache.ObjectName) *reconciler {
	if ro := l.ro.Load(); ro != nil && !ro.co.OnNew(key) {
		return ro.from
	}
	return l.rc
}

// ownTrigger parses a child's owner annotation and reports whether the
// trigger it names is one this rule watches: its kind, and its namespace
// when the watch is limited to one. A child whose trigger this rule cannot
// see — another syncloop's, a same-named rule watching elsewhere — is never
// this rule's to repair or prune.
func (l *ruleLoop) ownTrigger(owner string) (cache.ObjectName, bool) {
	t, ok := rules.ParseOwner(owner)
	w := l.rule.Watch
	if !ok || t.APIVersion != w.APIVersion || t.Kind != w.Kind {
		return cache.ObjectName{}, false
	}
	key := cache.ObjectName{Namespace: t.Namespace, Name: t.Name}
	if ns := l.watches.watchNamespace(); ns != "" && namespaced(l.watches.triggerMapping) && key.Namespace != ns {
		return cache.ObjectName{}, false
	}
	return key, true
}
