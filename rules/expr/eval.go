package expr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
)

// Activation holds the values one evaluation sees. Build it once per trigger
// and reuse it for every expression of that render.
type Activation struct {
	Object    map[string]any
	Variables map[string]any
	Rule      string
	// Item and Index are set inside forEach.
	Item  any
	Index int64
	// Children are the live (or rendered) children by id, for status.
	Children map[string]any
	// Lookups are the looked-up objects by lookup id: an object or nil for
	// a lookup by name, a list otherwise.
	Lookups map[string]any
	// Ready says, in the status, whether each resource is ready.
	Ready map[string]bool
	// Self is the live child a readyWhen is evaluated on.
	Self map[string]any
	// Cluster is the cluster a child is rendered for ({name, labels});
	// nil outside a resource that targets clusters.
	Cluster map[string]any
	// Clusters are, in the status, the clusters the trigger's children go
	// to and how they are there: [{name, ready, reason, message}].
	Clusters []any
	// Offline: children are rendered, not live, so a field only the server
	// sets is missing from them. A template string whose expression reads
	// one renders as Unknown instead of failing.
	Offline bool
	// Budget bounds what the values evaluated under it hold (nil: no
	// bound); copies of the activation share it.
	Budget *Budget
}

// vars are the activation's values as the programs of types vt (nil:
// untyped) see them, for cel-go to resolve by name: one per template
// render or evaluation, each value wrapped for its type once, and no map
// built to hold them.
func (a *Activation) vars(vt *valueTypes) *bindings {
	b := &bindings{a: a}
	switch {
	case a.Self != nil:
		b.self = a.Self
		if vt != nil {
			b.self = vt.self.Value(a.Self)
		}
		return b
	case vt == nil:
		b.object, b.item = a.Object, a.Item
		b.children, b.lookups = orEmpty(a.Children), orEmpty(a.Lookups)
	default:
		b.object = vt.object.Value(a.Object)
		b.children, b.lookups = vt.children.Value(orEmpty(a.Children)), vt.lookups.Value(orEmpty(a.Lookups))
		if a.Item != nil {
			b.item = vt.item.Value(a.Item)
		}
	}
	return b
}

// bindings implement interpreter.Activation over an Activation: object,
// variables, rule, item, index, children, lookups and ready — or, for a
// type's own rules, self alone.
type bindings struct {
	a                               *Activation
	object, item, children, lookups any
	self                            any // set: only self is bound
	// compared is the tally of the comparisons of the evaluation under
	// way (comparedVar), begun anew by each.
	compared tally
}

// ResolveName implements interpreter.Activation.
func (b *bindings) ResolveName(name string) (any, bool) {
	if name == comparedVar {
		return &b.compared, true
	}
	if b.self != nil {
		return b.self, name == varSelf
	}
	switch name {
	case varObject:
		return b.object, true
	case varVariables:
		return orEmpty(b.a.Variables), true
	case varRule:
		return b.a.Rule, true
	case varItem:
		return b.item, true
	case varIndex:
		return b.a.Index, true
	case varChildren:
		return b.children, true
	case varLookups:
		return b.lookups, true
	case varReady:
		return b.a.Ready, true
	case varCluster:
		return orEmpty(b.a.Cluster), true
	case varClusters:
		if b.a.Clusters == nil {
			return []any{}, true
		}
		return b.a.Clusters, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (b *bindings) Parent() interpreter.Activation { return nil }

// empty is what an activation binds for variables, children or lookups it
// does not have: read, never written.
var empty = map[string]any{}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return empty
	}
	return m
}

// native is the Go value the activation binds to name (what sizes are read
// from, whatever type the program sees it as).
func (a *Activation) native(name string) any {
	switch name {
	case varObject:
		return a.Object
	case varVariables:
		return a.Variables
	case varRule:
		return a.Rule
	case varItem:
		return a.Item
	case varIndex:
		return a.Index
	case varChildren:
		return a.Children
	case varLookups:
		return a.Lookups
	case varReady:
		return a.Ready
	case varSelf:
		return a.Self
	case varCluster:
		return a.Cluster
	case varClusters:
		return a.Clusters
	}
	return nil
}

// Unknown is what a template string renders offline when its expression
// reads a field of a child that only the server sets (an allocated
// clusterIP, a status): "(known after apply: <expression>)".
func Unknown(src string) string { return "(known after apply: " + strings.TrimSpace(src) + ")" }

// Unknown reports whether err, from evaluating p offline, comes from a
// field missing from a rendered child: the value is known only once the
// child is applied.
func (p *Program) Unknown(err error) bool {
	return len(p.childRefs) > 0 && err != nil && strings.HasPrefix(err.Error(), "no such key")
}

// Eval evaluates the program and returns its value as a JSON-compatible Go
// value (map[string]any, []any, string, int64, float64, bool or nil).
func (p *Program) Eval(ctx context.Context, a *Activation) (any, error) {
	v, err := p.eval(ctx, a, a.vars(p.vt))
	if err != nil {
		return nil, err
	}
	return toNative(v, a.Budget)
}

// EvalBool evaluates a BoolResult program.
func (p *Program) EvalBool(ctx context.Context, a *Activation) (bool, error) {
	v, err := p.eval(ctx, a, a.vars(p.vt))
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, fmt.Errorf("must produce a bool, produced %s", v.Type())
	}
	return bool(b), nil
}

// EvalList evaluates a ListResult program.
func (p *Program) EvalList(ctx context.Context, a *Activation) ([]any, error) {
	v, err := p.Eval(ctx, a)
	if err != nil {
		return nil, err
	}
	l, ok := v.([]any)
	if !ok && v != nil {
		return nil, fmt.Errorf("must produce a list, produced %T", v)
	}
	return l, nil
}

// eval evaluates p over vars, a's values as p sees them.
func (p *Program) eval(ctx context.Context, a *Activation, vars *bindings) (ref.Val, error) {
	var v ref.Val
	var err error
	vars.compared = tally{limit: p.cost.limit}
	switch {
	case !p.cost.untracked(a):
		v, _, err = p.prog.ContextEval(ctx, vars)
	case p.cost.bounded:
		// Within the limit over every input: it ends soon whatever ctx
		// does, so it is not watched for cancellation (ContextEval makes a
		// cancellable context for each evaluation, and registers it with
		// ctx: a third of what a template render allocates).
		v, _, err = p.cost.fast.Eval(vars)
	default:
		v, _, err = p.cost.fast.ContextEval(ctx, vars)
	}
	if err != nil {
		var cancelled interpreter.EvalCancelledError
		if errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded {
			if call, ok := strings.CutPrefix(cancelled.Message, refusedPrefix); ok {
				return nil, fmt.Errorf("%w: %s", ErrCostLimit, call)
			}
			return nil, fmt.Errorf("%w (limit %d)", ErrCostLimit, p.cost.limit)
		}
		return nil, err
	}
	return v, nil
}
