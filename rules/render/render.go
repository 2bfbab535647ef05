package render

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/internal/panics"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// Scoper says whether a kind is namespaced. The engine answers from the
// cluster's RESTMapper; offline rendering from OfflineScope.
type Scoper interface {
	Namespaced(gvk schema.GroupVersionKind) (bool, error)
}

// Child is one rendered child object and the resource that made it.
type Child struct {
	ResourceID string
	// Index is the forEach position, or -1 outside forEach.
	Index  int
	Object *unstructured.Unstructured
	// rules.Resource is the resource that made the child.
	Resource *rules.Resource
	// Patch: the object is not syncloop's; Object holds only the fields
	// to apply onto it, without syncloop's labels and annotations.
	Patch bool
	// Cluster is the cluster of the inventory the child goes to; "":
	// syncloop's own.
	Cluster string
}

// Rendered is the desired state of one trigger under one rule, and what
// became of it: the children rendered and applied, in dependency order,
// and the state of every resource.
type Rendered struct {
	// Skipped is true when the rule's `when` is false for the trigger: it
	// wants no children and writes no status.
	Skipped  bool
	Children []Child
	// Resources is the state of each resource, in dependency order (empty
	// when skipped).
	Resources []*ResourceState
	// Notes are what an offline render could not decide: a readyWhen that
	// cannot hold on a rendered child, an expression over a value only the
	// server sets.
	Notes []string
	// Conflicts are the children not applied because an object syncloop
	// may not write holds their name (see Takeover), or because they
	// are what one of the trigger's lookups reads.
	Conflicts []*ConflictError
	// ResyncAfter, when more than 0, is when the rule's function asked
	// for the trigger to be reconciled again.
	ResyncAfter time.Duration
	// Finalized: the rule's finalize function answered that it is done
	// with the trigger (only while it is being finalized).
	Finalized bool

	rule     *rules.Rule
	act      *expr.Activation
	children map[string]any  // live children by resource id, as status and dependents see them
	ready    map[string]bool // by resource id
	reads    lookupReads     // what the lookups read
	// absent are the required lookups whose object is absent (a list:
	// empty), in the order they are read, with what they asked.
	absent []LookupQuery
	// syncStatus is the status the rule's function returned; nil when it
	// was not called.
	syncStatus map[string]any
	// inClusters says, by cluster of the fleet, why the trigger's
	// children there are not ready or wait for a rollout.
	inClusters clusterNotes
}

// ResourceState is what one render made of one resource.
type ResourceState struct {
	Resource *rules.Resource
	// Excluded: the resource's `when` is false, or a resource it reads is
	// excluded: it wants no children.
	Excluded bool
	// WaitingFor, when not nil, is a resource this one reads whose
	// children do not all exist or are not all ready: this one was not
	// rendered and its children, if any, stay as they are.
	WaitingFor *rules.Resource
	// WaitingForLookup, when not nil, is a required lookup this one reads
	// whose object is absent (a list: empty): this one was not rendered
	// either.
	WaitingForLookup *rules.Lookup
	// Ready: every child exists and satisfies readyWhen.
	Ready bool
	// Why says, when not Ready, why not.
	Why string
	// Err is the first failure to apply one of its children.
	Err error
	// Clusters are, for a resource that targets clusters, those the
	// trigger selects, by name; Unreachable those of them its children
	// could not be brought about in (UnreachableError): they wait there,
	// as they are; Held those a rollout by cluster has not reached
	// (HeldError): they stay there as the previous revision made them.
	Clusters, Unreachable, Held []string
}

// Applier makes rendered children exist, in dependency order, and says
// what they now are. The engine applies each child (or finds it already as
// desired in its cache); offline, the rendered child stands for the live
// one.
type Applier interface {
	// Apply brings c about and returns it as it now is: the live object
	// when the rule reads it (rules.Rule.ReadsLive), otherwise any non-nil map;
	// nil when the object does not exist (a patch whose object is absent).
	// An error is that child's failure: its resource is not ready and the
	// resources that read it wait.
	Apply(ctx context.Context, c Child) (map[string]any, error)
	// Observed is c's object as it is in the cluster, the trigger's
	// child of this rule, without writing it; nil when there is none or
	// the Applier cannot tell. The render reads a child whose apply
	// failed as it is, so that the status follows what is there (a
	// collection's size, a field of the child applied before), as kro's
	// does, while the resource is not ready and the resources that read
	// it wait.
	Observed(c Child) map[string]any
}

// Input is what one render reads and whom it tells. Rule, Trigger and
// Scoper are needed; a nil reader reads nothing (no object is looked up,
// no cluster is known, the trigger has no children), and a nil Applier
// makes the render offline.
type Input struct {
	Rule    *rules.Rule
	Trigger *unstructured.Unstructured
	Scoper  Scoper
	// Lookups reads looked-up objects; nil only for a rule without
	// lookups.
	Lookups Lookuper
	// Clusters is the cluster inventory a resource's clusters select
	// from.
	Clusters ClusterLister
	// Children are the trigger's children in the cluster, as the rule's
	// function is given them.
	Children ChildLister
	// Resources says the resource (plural) a kind is served as; without
	// it, it is guessed from the kind, as kubectl does.
	Resources Resourcer
	// Applier brings children about; nil: the render is offline, each
	// rendered child standing for the live one (over Recorded's objects).
	Applier Applier
	// Recorded is, offline, the cluster's objects that rendered children
	// are laid over, and the webhook responses a test records.
	Recorded Recorded
	// Calls is told of each function call (the engine's metrics).
	Calls CallObserver
	// Finalizing: the trigger is being deleted, and the rule's finalize
	// function is called instead of its function.
	Finalizing bool
	// DryRun: the Applier only pretends, so children that were not
	// created have none of the fields the server sets, and a template
	// string reading one renders as expr.Unknown, as offline.
	DryRun bool
}

// ErrNotRecreated is what an Applier returns for a child of a createOnce
// resource (rules.Resource.CreateOnce) that was made for the trigger and
// deleted since: it is not created again. The resource is not ready (it
// has no object) and the resources that read it wait.
var ErrNotRecreated = errors.New("created once and deleted since; createOnce: not created again")

// RenderError is a failure to render a rule for a trigger. It names the
// place in the rule file, the rule, the resource and the field, and wraps
// the cause (errors.Is(err, expr.ErrCostLimit) works through it).
type RenderError struct {
	Pos      rules.Pos
	Rule     string
	Resource string // empty outside a resource
	Field    string
	Err      error
}

func (e *RenderError) Error() string {
	s := ""
	if p := e.Pos.String(); p != "" {
		s = p + ": "
	}
	s += fmt.Sprintf("rule %q: ", e.Rule)
	if e.Resource != "" {
		s += fmt.Sprintf("resource %q: ", e.Resource)
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Err.Error()
}

func (e *RenderError) Unwrap() error { return e.Err }

// MaxChildren bounds the children one trigger may render, over all of a
// rule's resources: a forEach over a list from the trigger must not turn one
// object into a flood of writes.
const MaxChildren = 10_000

// MaxRenderedBytes bounds what the values rendered for one trigger hold
// (expr.Budget): its children, variables and status, counted as the heap
// they would take were nothing shared (measured: about 1.8 times what
// they take). A render over it fails that trigger; 10,000 children of a
// few KB each are within it.
const MaxRenderedBytes = 128 << 20

// Rule computes and brings about what in.Rule wants for in.Trigger: it
// evaluates `when`, reads the lookups from lk, evaluates the variables,
// then walks the resources in dependency order. A resource whose
// dependencies' children all exist and are ready is rendered — its `when`,
// `forEach` and template see them as children.<id> — its children get
// namespaces defaulted (the Scoper says which kinds are namespaced) and
// syncloop's labels, annotations and controller ownerReference, and the
// Applier applies them; readyWhen is evaluated on what it returns. A
// resource whose dependencies are not ready waits: it is not rendered.
//
// With no Applier, the render is offline: each rendered child stands for
// the live one, dependents are rendered even when a readyWhen does not
// hold on a rendered child (reported in Notes), and a template string
// reading a field only the server sets renders as expr.Unknown. Rule
// reads nothing but its input.
//
// A panic in the render, or in what in holds, fails this render alone: it
// is returned as a RenderError wrapping a *panics.Error.
func Rule(ctx context.Context, in Input) (_ *Rendered, err error) {
	r, trigger := in.Rule, in.Trigger
	defer contain(r, &err)
	offline := in.Applier == nil
	act := &expr.Activation{Object: trigger.Object, Rule: r.Name, Variables: map[string]any{},
		Offline: offline || in.DryRun, Budget: expr.NewBudget(MaxRenderedBytes)}
	if r.Watch.When != nil {
		ok, err := r.Watch.When.EvalBool(ctx, act)
		if err != nil {
			return nil, exprError(r, r.Watch.When, "", err)
		}
		if !ok {
			return &Rendered{Skipped: true, rule: r, act: act}, nil
		}
	}
	var reads lookupReads
	if len(r.Lookups) > 0 {
		var err error
		if act.Lookups, reads, err = readLookups(ctx, r, act, trigger, in.Scoper, in.Lookups); err != nil {
			return nil, err
		}
	}
	absent := absentRequired(r, act.Lookups, reads)
	for _, v := range r.Variables {
		if waitingFor(v.Lookups, absent) != nil {
			act.Variables[v.Name] = nil // not evaluated: what reads it waits
			continue
		}
		val, err := v.Expr.Eval(ctx, act)
		if err != nil {
			return nil, exprError(r, v.Expr, "", err)
		}
		act.Variables[v.Name] = val
	}
	if offline {
		in.Applier = renderedApplier{objs: in.Recorded.Objects, rule: r, trigger: rules.TriggerOf(trigger)}
	}
	out := &Rendered{rule: r, act: act, children: map[string]any{}, ready: map[string]bool{}, reads: reads, absent: absent}
	if offline {
		for _, q := range absent {
			out.Notes = append(out.Notes, fmt.Sprintf("lookup %q is required and %s: the resources that read it wait", q.Lookup.ID, q.absence()))
		}
	}
	act.Children = out.children
	for _, res := range r.Resources {
		out.ready[res.ID] = false
		if res.Many() { // a list, empty until rendered
			out.children[res.ID] = []any{}
		}
	}
	w := &graphWalk{in: in, rd: out, offline: offline,
		seen: map[string]string{}, states: make(map[*rules.Resource]*ResourceState, len(r.Order))}
	for _, res := range r.Order {
		if err := w.resource(ctx, res); err != nil {
			return nil, err
		}
	}
	if offline && r.OrdersTeardown() && len(out.Children) > 0 {
		out.Notes = append(out.Notes, "teardown: Ordered: "+r.TeardownOrder())
	}
	return out, nil
}

// Waiting are the resources that were not rendered because a resource
// they read is not ready, or a required lookup they read is absent.
func (rd *Rendered) Waiting() []*ResourceState {
	var out []*ResourceState
	for _, st := range rd.Resources {
		if st.waits() {
			out = append(out, st)
		}
	}
	return out
}

func (st *ResourceState) waits() bool { return st.WaitingFor != nil || st.WaitingForLookup != nil }

// Status renders the rule's status for the trigger: the status its
// function returned, and over it the status template's fields, with
// children.<id> each resource's children as they were applied (a list for
// forEach resources; a resource without children is left out) and
// ready.<id> whether they all exist and are ready. It returns nil when the
// rule writes no status or the trigger was skipped.
//
// While a required lookup the status template reads is absent, or the
// rule's function was not called, what they write is left out; nil when
// that is all of it: the status waits, and its fields keep the values
// they have.
func (rd *Rendered) Status(ctx context.Context) (_ map[string]any, err error) {
	r := rd.rule
	defer contain(r, &err)
	if rd.Skipped {
		return nil, nil
	}
	out := maps.Clone(rd.syncStatus)
	if r.Status == nil || waitingFor(r.Status.Lookups, rd.absent) != nil {
		return out, nil
	}
	act := *rd.act
	act.Children = rd.children
	act.Ready = rd.ready
	act.Clusters = rd.ClusterStates()
	v, err := r.Status.Render(ctx, &act)
	if err != nil {
		return nil, templateError(r, r.Status.Template, "", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &RenderError{Pos: r.Status.Pos, Rule: r.Name, Field: r.Status.Field, Err: fmt.Errorf("rendered to %s, want a mapping", describe(v))}
	}
	if out == nil {
		return m, nil
	}
	maps.Copy(out, m)
	return out, nil
}

// contain, deferred by an entry point of the render, makes a panic there
// the render's error (a *panics.Error in a RenderError): what a trigger
// holds, however unusual, fails that trigger alone.
func contain(r *rules.Rule, err *error) {
	if v := recover(); v != nil {
		*err = &RenderError{Rule: r.Name, Err: panics.New(v)}
	}
}

func exprError(r *rules.Rule, e *rules.Expression, resource string, err error) error {
	return &RenderError{Pos: e.Pos, Rule: r.Name, Resource: resource, Field: e.Field, Err: err}
}

func templateError(r *rules.Rule, t *rules.Template, resource string, err error) error {
	var re *expr.RenderError
	if errors.As(err, &re) {
		err := re.Err
		if re.Expr != "" {
			err = fmt.Errorf("${%s}: %w", re.Expr, re.Err)
		}
		return &RenderError{Pos: t.PosOf(re.Path), Rule: r.Name, Resource: resource,
			Field: rules.PathField(t.Field, re.Path), Err: err}
	}
	return &RenderError{Pos: t.Pos, Rule: r.Name, Resource: resource, Field: t.Field, Err: err}
}

func namespacedName(obj *unstructured.Unstructured) string { return rules.RefOf(obj).NamespacedName() }

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%q", v)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%v", v)
}
