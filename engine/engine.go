package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
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
}

type noMetrics struct{}

func (noMetrics) ReconcileDone(string, string, time.Duration) {}
func (noMetrics) Write(string, string)                        {}
func (noMetrics) WatchError(string, string)                   {}
func (noMetrics) RuleRemoved(string)                          {}

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

// Engine runs one RuleController per rule of the set in force. It owns every
// goroutine it starts: Run returns only after all of them have ended.
type Engine struct {
	mapper   *dynamic.Mapper
	registry *dynamic.Registry
	writer   *dynamic.Writer
	recorder record.EventRecorder
	events   EventMode
	metrics  Metrics
	queues   workqueue.MetricsProvider
	drain    time.Duration
	ns       string  // Options.Namespace
	plan     Planner // nil unless dry run
	onePass  bool    // PlanOnce: each trigger once, no retries

	shardMu sync.RWMutex // guards shard and shards; SetShard holds it to change them
	shard   Shard
	shards  []shardChange // recent shards, oldest first (see ownedSince)

	mu          sync.Mutex
	controllers map[string]*controller
	applied     bool // a rule set has been applied: readiness means something
}

// New returns an Engine; nothing runs until Run.
func New(o Options) *Engine {
	var dc k8sdynamic.Interface
	if o.Client != nil {
		dc = o.Client.Dynamic
	}
	e := &Engine{
		mapper:      o.Mapper,
		registry:    dynamic.NewRegistry(dc, cache.Indexers{ownerIndex: ownerIndexFunc, ruleIndex: ruleIndexFunc, patchIndex: patchIndexFunc}),
		writer:      &dynamic.Writer{Client: o.Client, DryRun: o.Plan != nil},
		recorder:    o.Recorder,
		events:      o.Events,
		plan:        o.Plan,
		metrics:     o.Metrics,
		queues:      o.QueueMetrics,
		drain:       o.DrainTimeout,
		ns:          o.Namespace,
		shard:       o.Shard,
		controllers: map[string]*controller{},
	}
	if e.metrics == nil {
		e.metrics = noMetrics{}
	}
	if o.Shard != nil {
		e.shards = []shardChange{{s: o.Shard, at: time.Now()}}
	}
	e.registry.KeepManagedFields = rules.IsPatchManager
	e.registry.OnWatchError = func(key dynamic.WatchKey, err error) {
		e.metrics.WatchError(key.GVR.GroupResource().String(), errorReason(err))
	}
	if e.events == "" {
		e.events = EventsWarnings
	}
	if e.drain == 0 {
		e.drain = 30 * time.Second
	}
	if e.plan != nil {
		e.recorder = nil // a dry run persists nothing, Events included
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
	if e.plan == nil {
		return errors.New("PlanOnce needs Options.Plan")
	}
	e.onePass = true
	e.Apply(ctx, set)
	defer func() {
		e.Apply(ctx, nil)
		e.registry.Shutdown()
	}()
	// Idle twice in a row, 20ms apart: a key a worker has just taken from
	// its queue (not yet counted in flight) is in flight, or done, by the
	// second look.
	quiet := 0
	return wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(context.Context) (bool, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		for name, c := range e.controllers {
			state, detail := c.getState()
			switch {
			case state == StateWaiting && detail != "", state == StateFailed:
				return false, fmt.Errorf("rule %q: %s", name, detail)
			case state != StateRunning || !c.idle():
				quiet = 0
				return false, nil
			}
		}
		quiet++
		return quiet >= 2, nil
	})
}

// Run runs the rules of set, and then of each set received from updates
// (nil: none), until ctx ends; then it stops taking work, lets in-flight
// reconciles finish (up to the drain timeout), stops the informers and
// returns. Each new set is applied as Apply does: only added, changed and
// removed rules are touched.
func (e *Engine) Run(ctx context.Context, set *rules.Set, updates <-chan *rules.Set) error {
	e.Apply(ctx, set)
	for {
		select {
		case s, ok := <-updates:
			if !ok {
				updates = nil
				continue
			}
			e.Apply(ctx, s)
			continue
		case <-ctx.Done():
		}
		break
	}
	e.Apply(ctx, nil)
	e.registry.Shutdown()
	return nil
}

// Apply brings the running controllers in line with set: a rule whose hash
// is unchanged keeps its controller (queue, workers, informers); a changed
// rule's controller is stopped and a new one started; a removed rule's
// controller is stopped, leaving its children in place. A nil set stops
// everything. ctx is the parent of the controllers started.
func (e *Engine) Apply(ctx context.Context, set *rules.Set) {
	want := map[string]*rules.Rule{}
	if set != nil {
		for _, r := range set.Rules() {
			want[r.Name] = r
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.applied = set != nil
	var stopping []*controller
	retired := map[string][]schema.GroupVersionKind{}
	retiredPatches := map[string][]*patchWatch{}
	for name, c := range e.controllers {
		if r, ok := want[name]; !ok || r.Hash != c.rule.Hash {
			stopping = append(stopping, c)
			delete(e.controllers, name)
			if ok {
				retired[name] = retiredKinds(c, r)
				retiredPatches[name] = c.patches
			}
		}
	}
	var wg sync.WaitGroup
	for _, c := range stopping {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.stop()
		}()
	}
	wg.Wait()
	for _, c := range stopping {
		if _, kept := want[c.rule.Name]; !kept {
			e.metrics.RuleRemoved(c.rule.Name)
		}
	}
	for name, r := range want {
		if _, running := e.controllers[name]; !running {
			c := newController(e, r, retired[name], retiredPatches[name])
			e.controllers[name] = c
			c.start(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("rule", name)))
		}
	}
}

// retiredKinds are the child kinds that c's rule, or a version before it,
// made and r does not: the new controller prunes their children.
func retiredKinds(c *controller, r *rules.Rule) []schema.GroupVersionKind {
	keep := map[schema.GroupVersionKind]bool{}
	for _, res := range r.Resources {
		keep[res.GVK] = true
	}
	var out []schema.GroupVersionKind
	seen := map[schema.GroupVersionKind]bool{}
	old := append([]schema.GroupVersionKind{}, c.retired...)
	for _, res := range c.rule.Resources {
		old = append(old, res.GVK)
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
func (e *Engine) Informers() int { return e.registry.Len() }

// RuleState says where one rule's controller is: StateWaiting,
// StateSyncing, StateRunning or StateFailed; Detail says why a rule does not
// run.
type RuleState struct {
	Rule   string
	State  string
	Detail string
}

// States returns every rule's state, for readiness reporting.
func (e *Engine) States() []RuleState {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]RuleState, 0, len(e.controllers))
	for name, c := range e.controllers {
		st, detail := c.getState()
		out = append(out, RuleState{Rule: name, State: st, Detail: detail})
	}
	return out
}

// Ready reports whether a rule set is in force and every rule's controller
// runs.
func (e *Engine) Ready() bool {
	e.mu.Lock()
	applied := e.applied
	e.mu.Unlock()
	if !applied {
		return false
	}
	for _, s := range e.States() {
		if s.State != StateRunning {
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
	return "Unreachable"
}

// failed emits a Failed Warning Event for err on obj, if there is a
// recorder. A 429 is not a failure: the server asked syncloop to slow down,
// and the trigger is retried.
func (e *Engine) failed(obj *unstructured.Unstructured, err error) {
	if !apierrors.IsTooManyRequests(err) {
		e.event(obj, corev1.EventTypeWarning, "Failed", err.Error())
	}
}

// event emits an Event on obj, if there is a recorder.
func (e *Engine) event(obj *unstructured.Unstructured, eventType, reason, msg string) {
	if e.recorder != nil && obj != nil {
		e.recorder.Event(obj, eventType, reason, msg)
	}
}

// changes are the writes of one reconcile, for its Normal Event.
type changes struct {
	applied []string // "Created ConfigMap ns/name", "Updated …"
	pruned  []string // "Deleted ConfigMap ns/name"
}

// maxListed is how many writes one Normal Event names.
const maxListed = 5

// reconciled emits, with EventsAll, one Normal Event on obj listing what a
// reconcile changed; nothing when it changed nothing.
func (e *Engine) reconciled(obj *unstructured.Unstructured, ch *changes) {
	if e.recorder == nil || obj == nil || e.events != EventsAll {
		return
	}
	all := append(append([]string{}, ch.applied...), ch.pruned...)
	if len(all) == 0 {
		return
	}
	reason := "Applied"
	if len(ch.applied) == 0 {
		reason = "Pruned"
	}
	msg := strings.Join(all[:min(len(all), maxListed)], ", ")
	if len(all) > maxListed {
		msg += fmt.Sprintf(" and %d more", len(all)-maxListed)
	}
	e.recorder.Event(obj, corev1.EventTypeNormal, reason, msg)
}
