package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

// Metrics receives what the engine counts. A nil Metrics counts nothing.
type Metrics interface {
	// ReconcileDone counts one reconcile of rule with result "success" or
	// "error", and how long it took.
	ReconcileDone(rule, result string, took time.Duration)
	// Write counts one action of rule on a child or status: create,
	// update, adopt, unchanged, delete, status, wait (a resource left
	// unapplied until one it reads is ready) or conflict (a child left
	// unapplied: an object syncloop may not take over holds its name).
	Write(rule, action string)
	// WatchError counts one failed list or watch of resource
	// ("resource.group"), by reason: the API status reason (Forbidden,
	// Expired, …) or Unreachable when no answer came.
	WatchError(resource, reason string)
	// RuleRemoved drops what is counted for a rule no longer in force, so
	// that rules coming and going leave no series behind.
	RuleRemoved(rule string)
	// Panicked counts one panic contained in a unit of work of rule
	// (where: PanicReconcile, PanicHandler, PanicLoop, PanicRollout).
	Panicked(rule, where string)
	// DriftRepaired counts one repair of a child of rule whose fields
	// manager had changed ("unknown" when it could not be told).
	DriftRepaired(rule, manager string)
	// FunctionCalled counts one call of the function of rule's resource
	// (rules.SyncResourceID: the rule's function) by transport (wasm,
	// webhook) and result (success, error), and how long it took.
	FunctionCalled(rule, resource, transport, result string, took time.Duration)
	// Watching is told that an informer of resource ("resource.group")
	// starts, before it lists: WatchError may count it from then on.
	Watching(resource string)
}

// What Metrics is told that is known in advance: a metrics
// implementation makes their series at 0 before the first is counted,
// so that an alert on their increase sees it.
var (
	// ReconcileResults are ReconcileDone's results.
	ReconcileResults = []string{ResultSuccess, ResultError}
	// WriteActions are Write's actions.
	WriteActions = []string{ActionCreate, ActionUpdate, ActionAdopt, WriteUnchanged, ActionDelete, ActionStatus, ActionWait, ActionConflict}
	// PanicWheres are where Panicked says a panic of a rule was contained.
	PanicWheres = []string{PanicReconcile, PanicHandler, PanicLoop, PanicRollout}
	// WatchReasons are the reasons WatchError says most (errorReason):
	// missing RBAC, etcd compacted, no answer.
	WatchReasons = []string{string(metav1.StatusReasonForbidden), string(metav1.StatusReasonExpired), ReasonUnreachable}
)

// The results of a reconcile or a function call, and the action of a
// child left as it is, as Metrics is told them.
const (
	ResultSuccess  = "success"
	ResultError    = "error"
	WriteUnchanged = "unchanged"
	// ReasonUnreachable is WatchError's reason when no answer came.
	ReasonUnreachable = "Unreachable"
)

type noMetrics struct{}

func (noMetrics) ReconcileDone(string, string, time.Duration)                  {}
func (noMetrics) Write(string, string)                                         {}
func (noMetrics) WatchError(string, string)                                    {}
func (noMetrics) RuleRemoved(string)                                           {}
func (noMetrics) Panicked(string, string)                                      {}
func (noMetrics) DriftRepaired(string, string)                                 {}
func (noMetrics) FunctionCalled(string, string, string, string, time.Duration) {}
func (noMetrics) Watching(string)                                              {}

// Options configure an Engine.
type Options struct {
	// Client lists, watches and writes (dynamic.NewClient).
	Client *dynamic.Client
	// Mapper maps kinds to resources.
	Mapper *dynamic.Mapper
	// Recorder emits Events on triggers; nil emits none.
	Recorder record.EventRecorder
	// Metrics counts reconciles and writes; nil counts nothing.
	Metrics Metrics
	// QueueMetrics receives client-go's workqueue metrics, one queue per
	// rule named after it; nil records none.
	QueueMetrics workqueue.MetricsProvider
	// DrainTimeout bounds how long shutdown waits for in-flight reconciles
	// before cancelling their requests; 0 means 30 seconds.
	DrainTimeout time.Duration
	// Namespace, when set, limits the engine to one namespace, so that it
	// needs no cluster-wide rights: every informer lists and watches in it,
	// and a rule whose trigger or child kinds are cluster-scoped, or that
	// watches another namespace, fails (StateFailed); a child rendered into
	// another namespace fails its trigger.
	Namespace string
	// Events says which Events are emitted on triggers: EventsWarnings
	// (the default) or EventsAll.
	Events EventMode
	// Shard, when set, limits the engine to the triggers it owns (replicas
	// sharing the triggers); SetShard changes it. Nil: every trigger.
	Shard Shard
	// Rollouts keeps the rules' rollouts where a restart finds them, and
	// says their transitions; nil keeps them in memory only (a restart
	// moves a changed rule's triggers at once).
	Rollouts RolloutStore
	// Fights says when a child another writer keeps changing is left
	// alone for a while; the zero value is DefaultFightPolicy.
	Fights FightPolicy
	// Fleet, when set, is the inventory of clusters the children of rules
	// that target clusters go to; nil: such children wait, their clusters
	// not reachable.
	Fleet Fleet
	// Plan, when set, makes the engine a dry run: every write becomes a
	// server-side dry-run request (dryRun=All: defaulting and admission
	// apply, nothing is persisted) and an Action for Plan. No Event is
	// emitted.
	Plan Planner
}

// EventMode says which Events the engine emits on triggers.
type EventMode string

const (
	// EventsWarnings emits only Warning Events: one Failed Event for every
	// reconcile that fails. Success costs no write beyond the children's.
	EventsWarnings EventMode = "warnings"
	// EventsAll also emits one Normal Event for every reconcile that
	// changed something (reason Applied, or Pruned when it only deleted),
	// listing what it created, updated and deleted.
	EventsAll EventMode = "all"
)

// ParseEventMode parses "warnings" or "all"; "" is EventsWarnings.
func ParseEventMode(s string) (EventMode, error) {
	switch m := EventMode(s); m {
	case "":
		return EventsWarnings, nil
	case EventsWarnings, EventsAll:
		return m, nil
	}
	return "", fmt.Errorf("events must be %q or %q, not %q", EventsWarnings, EventsAll, s)
}

// Engine runs one loop per rule of the set in force (ruleLoop). It owns
// every goroutine it starts: Run returns only after all of them have ended.
type Engine struct {
	mapper *dynamic.Mapper
	// actors are the identities rules act as, each with its informers and
	// its client (DryRun in a dry run).
	actors *actors
	// out is where writes and records go: live, or a plan (Options.Plan).
	out      outputs
	metrics  Metrics
	queues   workqueue.MetricsProvider
	drain    time.Duration
	ns       string // Options.Namespace
	rollouts RolloutStore
	removals removals // of rules removed from the set
	planned  planned  // what PlanOnce did, once it has
	fights   FightPolicy
	share    shares // the engine's share of the triggers (shard.go)

	set ruleSet // the loops of the rules in force
}

// ruleSet is the loops of the rule set in force, and of those Enforce is
// stopping.
type ruleSet struct {
	// enforcing makes calls of Enforce take turns: Enforce alone writes
	// loops.
	enforcing sync.Mutex
	// mu guards loops, draining and applied, and is held only to read or
	// change them: never across a drain or a request.
	mu    sync.Mutex
	loops map[string]*ruleLoop
	// draining are the loops Enforce is stopping: their reconciles still
	// run until they have.
	draining []*ruleLoop
	applied  bool // a rule set has been applied: readiness means something
}

// New returns an Engine; nothing runs until Run.
func New(o Options) *Engine {
	e := &Engine{
		mapper:   o.Mapper,
		metrics:  o.Metrics,
		queues:   o.QueueMetrics,
		drain:    o.DrainTimeout,
		ns:       o.Namespace,
		rollouts: o.Rollouts,
		fights:   o.Fights,
		set:      ruleSet{loops: map[string]*ruleLoop{}},
		removals: removals{running: map[string]context.CancelFunc{}},
	}
	e.share.init(o.Shard, o.Plan == nil)
	if e.metrics == nil {
		e.metrics = noMetrics{}
	}
	events := o.Events
	if events == "" {
		events = EventsWarnings
	}
	e.out = liveOutputs(e.metrics, o.Recorder, events, o.Rollouts)
	if o.Plan != nil {
		e.out = planOutputs(o.Plan, false)
	}
	e.actors = newActors(o.Client, o.Plan != nil,
		cache.Indexers{ownerIndex: ownerIndexFunc, ruleIndex: ruleIndexFunc, patchIndex: patchIndexFunc},
		func(reg *dynamic.Registry) {
			reg.KeepManagedFields = rules.IsPatchManager
			reg.Keep = e.keep
			reg.OnWatchStart = func(key dynamic.WatchKey) { e.metrics.Watching(key.GVR.GroupResource().String()) }
			reg.OnWatchError = func(key dynamic.WatchKey, err error) {
				e.metrics.WatchError(key.GVR.GroupResource().String(), errorReason(err))
			}
		})
	e.actors.fleet = o.Fleet
	if e.drain == 0 {
		e.drain = 30 * time.Second
	}
	return e
}

// PlanOnce computes, with dry-run requests, what one reconcile of every
// trigger of every rule in set would do, hands each action to the engine's
// Planner, and returns once all are done; a trigger that fails is reported
// through Planner.Failed and not retried. It returns an error when a rule
// cannot be planned at all (its kind is not served). The engine must have
// been made with Options.Plan and must not be running.
func (e *Engine) PlanOnce(ctx context.Context, set *rules.Set) error {
	if e.out.plan == nil {
		return errors.New("PlanOnce needs Options.Plan")
	}
	e.out = planOutputs(e.out.plan, true)
	e.Enforce(ctx, set)
	e.removals.wg.Wait() // the removals of rules no longer in set: planned in full
	defer func() {
		e.planned.rollouts = e.Rollouts()
		e.planned.reconciles, _ = e.Progress()
		e.Enforce(ctx, nil)
		e.shutdown()
	}()
	// Idle twice in a row, 20ms apart: a key a worker has just taken from
	// its queue (not yet counted in flight) is in flight, or done, by the
	// second look.
	quiet := 0
	return wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		e.set.mu.Lock()
		defer e.set.mu.Unlock()
		for name, l := range e.set.loops {
			state, detail := l.getState()
			switch {
			// A plan is one look: a list refused (the rule's identity may
			// not) or unanswered is its failure, not something to wait out.
			case state == StateWaiting && detail != "", state == StateFailed,
				state == StateSyncing && strings.HasPrefix(detail, cannotSync):
				return false, fmt.Errorf("rule %q: %s", name, detail)
			case state != StateRunning || !l.idle() || l.rolloutStarting() || (l.fleet != nil && l.fleet.sweepPending()):
				quiet = 0
				return false, nil
			}
		}
		quiet++
		return quiet >= 2, nil
	})
}

// planned is what PlanOnce did: the rollouts it planned, and its
// reconciles (its rules' loops are gone once it returns).
type planned struct {
	rollouts   []rollout.Status
	reconciles int64
}

// Progress is how far the rules in force have come: the reconciles done
// since they started (in a plan, the triggers planned; once PlanOnce has
// returned, all it did), and the triggers queued or being reconciled now.
// Cheap: counters and queue lengths.
func (e *Engine) Progress() (reconciled, queued int64) {
	e.set.mu.Lock()
	defer e.set.mu.Unlock()
	if len(e.set.loops) == 0 {
		return e.planned.reconciles, 0
	}
	for _, l := range e.set.loops {
		reconciled += l.reconciles.Load()
		queued += int64(l.queue.Len()) + l.inFlight.Load()
	}
	return reconciled, queued
}

// Run runs the rules of set, and then of each set received from updates
// (nil: none), until ctx ends; then it stops taking work, lets in-flight
// reconciles finish (up to the drain timeout), stops the informers and
// returns. Each new set is put in force as Enforce does: only added, changed and
// removed rules are touched.
func (e *Engine) Run(ctx context.Context, set *rules.Set, updates <-chan *rules.Set) error {
	e.Enforce(ctx, set)
	for {
		select {
		case s, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			e.Enforce(ctx, s)
			continue
		case <-ctx.Done():
		}
		break
	}
	e.Enforce(ctx, nil)
	e.shutdown()
	return nil
}

// shutdown stops every informer, of every identity and cluster.
func (e *Engine) shutdown() {
	e.actors.shutdown()
	e.actors.remotes.each(func(a *actor) { a.registry.Shutdown() })
}

// Enforce puts set in force, bringing the running loops in line with it:
// a rule whose hash is unchanged keeps its loop (queue, workers,
// informers); a changed rule's loop is stopped and a new one started (or
// rolls out from the old, rollout.go); a removed rule's loop is stopped,
// leaving its children in place. A nil set stops everything. ctx is the
// parent of the loops started.
//
// Calls of Enforce take turns (enforcing). The loops' map is locked only
// to read or change it, never while a loop drains or a store is read:
// States, Ready and the metrics answer at once during a rule change,
// reporting a stopping loop until it has stopped.
func (e *Engine) Enforce(ctx context.Context, set *rules.Set) {
	want := map[string]*rules.Rule{}
	if set != nil {
		for _, r := range set.Rules() {
			want[r.Name] = r
		}
	}
	e.set.enforcing.Lock()
	defer e.set.enforcing.Unlock()
	ch := e.retire(ctx, want, set != nil)
	stopLoops(ctx, ch.stopping, want, set != nil)
	for _, l := range ch.stopping {
		if _, kept := want[l.rule.Name]; !kept {
			e.metrics.RuleRemoved(l.rule.Name)
		}
	}
	// Only Enforce writes loops, and it holds enforcing: reading the map
	// here needs no lock.
	started := map[string]*ruleLoop{}
	for name, r := range want {
		if _, running := e.set.loops[name]; !running {
			p, changed := ch.rollouts[name]
			if _, stopped := ch.retired[name]; !changed && !stopped {
				p = e.resumeRollout(ctx, r) // new here: perhaps changed while syncloop was down
			}
			started[name] = newRuleLoop(e, r, ch.retired[name], ch.retiredPatches[name], p)
		}
	}
	e.set.mu.Lock()
	e.set.draining = nil
	for name, l := range started {
		e.set.loops[name] = l
		l.start(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("rule", name)))
	}
	inUse := map[rules.ServiceAccount]bool{}
	for _, l := range e.set.loops {
		inUse[l.rule.Identity] = true
	}
	e.set.mu.Unlock()
	e.removals.setInForce(want, set)
	if set != nil {
		e.startRemovals(ctx, set)
	}
	e.actors.forget(inUse)
}

// retirement is what Enforce takes from the loops it stops: the loops, and
// for each rule changed the kinds and patches its new loop prunes and the
// rollout it starts from.
type retirement struct {
	stopping       []*ruleLoop
	retired        map[string][]schema.GroupVersionKind
	retiredPatches map[string][]*patchWatch
	rollouts       map[string]*rollout.Plan
}

// retire moves the loops of rules changed or removed from loops to
// draining, and updates the settings of those kept.
func (e *Engine) retire(ctx context.Context, want map[string]*rules.Rule, applying bool) retirement {
	ch := retirement{retired: map[string][]schema.GroupVersionKind{}, retiredPatches: map[string][]*patchWatch{}, rollouts: map[string]*rollout.Plan{}}
	e.set.mu.Lock()
	defer e.set.mu.Unlock()
	e.set.applied = applying
	for name, l := range e.set.loops {
		r, ok := want[name]
		if ok && r.Hash == l.rule.Hash {
			if ro := l.ro.Load(); ro != nil {
				ro.co.SetSettings(ctx, r.Rollout)
			}
			if l.fleet != nil {
				l.fleet.setBudget(r.Rollout.MaxPrunes)
			}
			continue
		}
		ch.stopping = append(ch.stopping, l)
		delete(e.set.loops, name)
		if !ok {
			continue
		}
		ch.retired[name] = retiredKinds(l.watches, r)
		ch.retiredPatches[name] = l.watches.patches
		if p := e.rolloutFrom(l, r); p != nil {
			ch.rollouts[name] = p
		}
		if ro := l.ro.Load(); ro != nil {
			go l.step(ctx, func(ctx context.Context) { ro.co.Supersede(ctx, r.Hash) })
			// What the revision rolled out from made is pruned too.
			for _, gvk := range retiredKinds(ro.from.w, r) {
				if !slices.Contains(ch.retired[name], gvk) {
					ch.retired[name] = append(ch.retired[name], gvk)
				}
			}
			ch.retiredPatches[name] = append(ch.retiredPatches[name], ro.from.w.patches...)
		}
	}
	e.set.draining = ch.stopping
	return ch
}

// stopLoops stops the loops stopping, together, and waits. A rule
// removed from the set in force (applying: not a shutdown), or no longer
// ordering its teardown, lets go of the triggers it held once its loop
// has stopped.
func stopLoops(ctx context.Context, stopping []*ruleLoop, want map[string]*rules.Rule, applying bool) {
	var wg sync.WaitGroup
	for _, l := range stopping {
		r, kept := want[l.rule.Name]
		release := applying && l.mayHold() && (!kept || !r.HoldsTriggers())
		wg.Go(func() {
			l.stop()
			if release {
				l.unholdAll(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("rule", l.rule.Name)))
			}
		})
	}
	wg.Wait()
}

// retiredKinds are the child kinds that w's rule, or a version before it,
// made and r does not: the new loop prunes their children.
func retiredKinds(w *watches, r *rules.Rule) []schema.GroupVersionKind {
	keep := map[schema.GroupVersionKind]bool{}
	for _, res := range r.Resources {
		for _, k := range res.Kinds {
			keep[k.GVK] = true
		}
	}
	var out []schema.GroupVersionKind
	seen := map[schema.GroupVersionKind]bool{}
	old := append([]schema.GroupVersionKind{}, w.retired...)
	for _, res := range w.rule.Resources {
		for _, k := range res.Kinds {
			old = append(old, k.GVK)
		}
	}
	for _, gvk := range old {
		if !keep[gvk] && !seen[gvk] {
			seen[gvk] = true
			out = append(out, gvk)
		}
	}
	return out
}

// Informers is how many shared informers run.
func (e *Engine) Informers() int {
	n := e.actors.informers()
	e.actors.remotes.each(func(a *actor) { n += a.registry.Len() })
	return n
}

// RuleState says where one rule's loop is: StateWaiting,
// StateSyncing, StateRunning or StateFailed; Detail says why a rule does not
// run.
type RuleState struct {
	Rule   string
	State  string
	Detail string
	// Identity is the ServiceAccount the rule acts as, namespace/name; ""
	// syncloop's own.
	Identity string
	// Tenant is the namespace of a tenant rule; "" for the platform's.
	Tenant string
}

// States returns every rule's state, for readiness reporting.
func (e *Engine) States() []RuleState {
	loops := e.allLoops()
	out := make([]RuleState, 0, len(loops))
	for _, l := range loops {
		st, detail := l.getState()
		out = append(out, RuleState{Rule: l.rule.Name, State: st, Detail: detail, Identity: l.rule.Identity.String(), Tenant: l.rule.Tenant})
	}
	return out
}

// allLoops are the loops in force and those stopping: every loop that may
// be reconciling. During a rule change, a rule's stopping loop stands in
// for the one that replaces it.
func (e *Engine) allLoops() []*ruleLoop {
	e.set.mu.Lock()
	defer e.set.mu.Unlock()
	out := make([]*ruleLoop, 0, len(e.set.loops)+len(e.set.draining))
	for _, l := range e.set.loops {
		out = append(out, l)
	}
	return append(out, e.set.draining...)
}

// Ready reports whether a rule set is in force and every rule's loop runs
// — every platform rule's: a team's tenant rule that cannot run (its
// ServiceAccount lacks a right) says so in its state, and never makes the
// replica unready for the others.
func (e *Engine) Ready() bool {
	e.set.mu.Lock()
	applied := e.set.applied
	e.set.mu.Unlock()
	if !applied {
		return false
	}
	for _, s := range e.States() {
		if s.State != StateRunning && s.Tenant == "" {
			return false
		}
	}
	return true
}

// errorReason is the API status reason of err (Forbidden, Expired, …),
// Unreachable when the API server did not answer.
func errorReason(err error) string {
	if r := apierrors.ReasonForError(err); r != metav1.StatusReasonUnknown {
		return string(r)
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return fmt.Sprintf("HTTP%d", status.Status().Code)
	}
	return ReasonUnreachable
}
