package expr

import (
	"fmt"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// Comparisons charged by what they read. cel-go charges a == b, a != b
// and x in l by the top-level sizes of their operands, but compares at
// every depth, and a value an expression builds may share its parts:
// cel.bind(a, [b, b, …], …) lists b ten times for the cost of one list,
// so eight such levels hold 10^8 elements, and a == a took 3 s (a map 14 s
// and 3.5 GB) charged fewer than 400 — no limit, nor the deadline of an
// untracked evaluation, stopped it.
//
// So every comparison of two values that may hold lists or maps (deep)
// is measured before it is made, at every depth (weigh, stopping at the
// limit), and counts what it may read on a tally of its own: the
// comparisons of one evaluation may read as many elements, keys and
// tenths of a character as the cost limit. The one that would read more
// ends the evaluation with the cost-limit error and is not made. The
// tracker's own charges stay as they are — so its estimate still bounds
// them, and an evaluation proved within the limit still runs untracked —
// and the tally holds on both programs alike: together they bound an
// evaluation's work to twice the limit.

// comparedVar is the name the tally is bound to in an activation; no
// expression can spell it.
const comparedVar = "@compared"

// compared are the comparisons charged, by the function name the
// interpreter plans them under, and how a refusal spells them.
var compared = map[string]string{operators.Equals: "==", operators.NotEquals: "!=", operators.In: "in"}

// guardComparisons is the program option that charges the comparisons of
// checked that may read more than cel-go charges (==, != over two deep
// operands, in over a deep container), and flattens the lists its +
// makes (concatenation).
func guardComparisons(checked *cel.Ast, limit uint64) cel.ProgramOption {
	typeMap := checked.NativeRep().TypeMap()
	return cel.CustomDecoratorV2(func(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
		call, ok := i.(interpreter.InterpretableCall)
		if !ok || len(call.Args()) != 2 {
			return i, nil
		}
		args := call.Args()
		switch fn := call.Function(); {
		case fn == operators.Add && mayList(typeMap[call.ID()]):
			return &concatenation{InterpretableCall: call, limit: limit}, nil
		case compared[fn] == "":
		case fn == operators.In && deep(typeMap[args[1].ID()]),
			deep(typeMap[args[0].ID()]) && deep(typeMap[args[1].ID()]):
			return &comparison{InterpretableCall: call, limit: limit}, nil
		}
		return i, nil
	})
}

// deep reports whether comparing a value of type t may read more than
// cel-go charges, 0.1 a top-level element: it is a list or a map (whose
// elements may be strings, or lists, and may share their parts), or its
// type is not known.
func deep(t *types.Type) bool {
	if t == nil {
		return true
	}
	switch t.Kind() {
	case types.ListKind, types.MapKind, types.DynKind, types.AnyKind, types.TypeParamKind, types.StructKind:
		return true
	case types.OpaqueKind:
		return t.TypeName() == "optional_type" && deep(t.Parameters()[0])
	}
	return false
}

// mayList reports whether a value of type t may be a list.
func mayList(t *types.Type) bool {
	if t == nil {
		return true
	}
	switch t.Kind() {
	case types.ListKind, types.DynKind, types.AnyKind, types.TypeParamKind:
		return true
	}
	return false
}

// A concatenation is a + whose result may be a list. cel-go makes a + b
// a lazy list over a and b for a charge of 1, so cel.bind(a1, a0 + a0, …)
// doubles a list with each level for a few steps' cost, and reading an
// element walks every level: 2^40 elements for a charge of 40, which a
// sort or a slice then copied before it was charged. Here the list a + b
// makes is copied flat, its size counted on the evaluation's tally before
// the copy: what a + b makes costs what it holds. A comprehension's
// result list, which cel-go appends to in place, is left as it is.
type concatenation struct {
	interpreter.InterpretableCall
	limit uint64
}

// Eval implements interpreter.Interpretable.
func (c *concatenation) Eval(a interpreter.Activation) ref.Val {
	return c.Exec(interpreter.AsFrame(a))
}

// Exec implements interpreter.InterpretableV2.
func (c *concatenation) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	v := c.InterpretableCall.Exec(frame)
	l, ok := v.(traits.Lister)
	if !ok {
		return v
	}
	if _, inPlace := v.(traits.MutableLister); inPlace {
		return v
	}
	n := celSize(l)
	if t := comparedTally(frame, c.limit); !t.add(n) {
		refuseComparison("+", v, types.Int(n), c.limit)
	}
	flat := make([]ref.Val, 0, n)
	for it := l.Iterator(); it.HasNext() == types.True; {
		flat = append(flat, it.Next())
	}
	return types.NewRefValList(types.DefaultTypeAdapter, flat)
}

// A comparison is a charged ==, != or in: its operands evaluated, then
// measured, then compared as the interpreter compares them.
type comparison struct {
	interpreter.InterpretableCall
	limit uint64
}

// Eval implements interpreter.Interpretable.
func (c *comparison) Eval(a interpreter.Activation) ref.Val {
	return c.Exec(interpreter.AsFrame(a))
}

// Exec implements interpreter.InterpretableV2.
func (c *comparison) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	args := c.Args()
	lhs, rhs := args[0].Exec(frame), args[1].Exec(frame)
	if types.IsUnknownOrError(lhs) {
		return lhs
	}
	if types.IsUnknownOrError(rhs) {
		return rhs
	}
	c.charge(frame, lhs, rhs)
	switch c.Function() {
	case operators.Equals:
		return types.Equal(lhs, rhs)
	case operators.NotEquals:
		return types.Bool(types.Equal(lhs, rhs) != types.True)
	}
	// @in, as the standard library's inAggregate.
	if rhs.Type().HasTrait(traits.ContainerType) {
		return types.LabelErrNode(c.ID(), rhs.(traits.Container).Contains(lhs))
	}
	return types.NewErrWithNodeID(c.ID(), "no such overload: %s", c.Function())
}

// charge counts on the evaluation's tally what comparing lhs with rhs
// reads at most, and ends the evaluation (refuseComparison) when that
// is more than the tally has left. Equal operands are read side by side
// to the end of the smaller; x in l compares x with each element of l.
func (c *comparison) charge(frame *interpreter.ExecutionFrame, lhs, rhs ref.Val) {
	t := comparedTally(frame, c.limit)
	left := t.limit - min(t.count(), t.limit)
	var n uint64
	if l, ok := rhs.(traits.Lister); ok && c.Function() == operators.In {
		// x against each element, or, where that is more than is left,
		// what the list holds, if it holds less.
		if n = mul(celSize(l), weight(lhs, left, bytesRead)); n > left {
			n = min(n, weight(l, left, bytesRead))
		}
	} else if c.Function() != operators.In {
		a := weight(lhs, left, bytesRead)
		n = weight(rhs, min(a, left), bytesRead)
	} // x in a map: one lookup, by a key
	if !t.add(n) {
		refuseComparison(compared[c.Function()], lhs, rhs, c.limit)
	}
}

// comparedTally is the tally the evaluation frame belongs to binds
// (comparedVar), or a tally of its own for one comparison where none is
// bound.
func comparedTally(frame *interpreter.ExecutionFrame, limit uint64) *tally {
	if v, ok := frame.ResolveName(comparedVar); ok {
		if t, ok := v.(*tally); ok {
			return t
		}
	}
	return &tally{limit: limit}
}

// refuseComparison ends the evaluation with the cost-limit error, as
// refuse does for a call, naming the comparison and its operands.
func refuseComparison(op string, lhs, rhs ref.Val, limit uint64) {
	panic(interpreter.EvalCancelledError{
		Cause: interpreter.CostLimitExceeded,
		Message: fmt.Sprintf("%s%s over %s would take what this evaluation's comparisons and concatenations read past the limit of %d",
			refusedPrefix, op, describeArgs([]ref.Val{lhs, rhs}), limit),
	})
}
