package expr

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
	"k8s.io/apimachinery/pkg/api/resource"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/library"
)

// guardedCalls redefines every overload of env that callCosts charges
// (the same ID and signature, so the checker's estimates and the
// tracker's charges stay): the call is measured before it is made, and
// one whose charge alone exceeds the limit is not made. cel-go charges a
// call only once it has returned, so a call over inputs a trigger's
// author chose ran to the end before the limit could stop it:
// sets.intersects over two lists of 60,000 took 105 s, 400 deepMerges of
// a 410 KB map 19 s, a flatten of 16,000 references to a list of 16,000
// longer than 100 s, before "cost limit exceeded" or none at all.
//
// A refused call ends the evaluation, as the tracker ends it at the
// limit (refuse): an error value could be absorbed (an `||`, an exists)
// and the evaluation go on to measure the next call.
func guardedCalls(env *cel.Env, limit uint64) ([]cel.EnvOption, error) {
	var opts []cel.EnvOption
	for name, fn := range env.Functions() {
		impls, err := fn.Bindings()
		if err != nil {
			return nil, fmt.Errorf("guarding %s: %w", name, err)
		}
		for _, o := range fn.OverloadDecls() {
			cost := callCosts[o.ID()]
			if cost.charge == nil || cost.after {
				continue
			}
			charge := cost.charge
			i := slices.IndexFunc(impls, func(f *functions.Overload) bool { return f.Operator == o.ID() })
			if i < 0 {
				return nil, fmt.Errorf("guarding %s: overload %s has no implementation", name, o.ID())
			}
			impl := impls[i]
			binding := cel.FunctionBinding(func(args ...ref.Val) ref.Val {
				if charge(args, limit) > limit {
					refuse(name, args, limit)
				}
				return call(impl, args)
			})
			overload := cel.Overload
			if o.IsMemberFunction() {
				overload = cel.MemberOverload
			}
			overloadOpts := []cel.OverloadOpt{binding}
			if trait := o.OperandTrait(); trait != 0 {
				overloadOpts = append(overloadOpts, cel.OverloadOperandTrait(trait))
			}
			opts = append(opts, cel.Function(name, overload(o.ID(), o.ArgTypes(), o.ResultType(), overloadOpts...)))
		}
	}
	return opts, nil
}

// costOptions are the cost tracker's options for the programs of env:
// the Kubernetes library's runtime costs, as the API server counts them,
// and over them the charges of callCosts, charged after each call —
// by overload, and, for a call cel-go dispatches among a function's
// overloads only when it runs (an argument the checker knows only as
// dyn: object.s.reverse()), by the function's name, as the most any of
// them charges.
func costOptions(env *cel.Env, limit uint64) []cel.ProgramOption {
	est := &callEstimator{byFunction: map[string][]chargeFunc{}, limit: limit}
	var trackers []interpreter.CostTrackerOption
	for name, fn := range env.Functions() {
		rows := map[int]bool{}
		for _, o := range fn.OverloadDecls() {
			cost := callCosts[o.ID()]
			if cost.charge == nil {
				continue
			}
			trackers = append(trackers, interpreter.OverloadCostTracker(o.ID(), func(args []ref.Val, _ ref.Val) *uint64 {
				n := cost.charge(args, limit)
				return &n
			}))
			if !rows[cost.row] {
				rows[cost.row] = true
				est.byFunction[name] = append(est.byFunction[name], cost.charge)
			}
		}
	}
	return []cel.ProgramOption{cel.CostTracking(est), cel.CostTrackerOptions(trackers...)}
}

// callEstimator charges a call dispatched by its function's name (its
// overload ID is "") the most its overloads' charges would, and leaves
// every other call to the Kubernetes library's estimator. The tracker
// asks it only of calls no overload tracker charges.
type callEstimator struct {
	library.CostEstimator
	byFunction map[string][]chargeFunc
	limit      uint64
}

// CallCost implements interpreter.ActualCostEstimator.
func (e *callEstimator) CallCost(function, overloadID string, args []ref.Val, result ref.Val) *uint64 {
	if charges := e.byFunction[function]; overloadID == "" && len(charges) > 0 {
		var most uint64
		for _, charge := range charges {
			most = max(most, charge(args, e.limit))
		}
		return &most
	}
	return e.CostEstimator.CallCost(function, overloadID, args, result)
}

// call calls the implementation f with args.
func call(f *functions.Overload, args []ref.Val) ref.Val {
	switch {
	case len(args) == 1 && f.Unary != nil:
		return f.Unary(args[0])
	case len(args) == 2 && f.Binary != nil:
		return f.Binary(args[0], args[1])
	case f.Function != nil:
		return f.Function(args...)
	}
	return types.NewErr("no such overload: %s", f.Operator)
}

// refusedPrefix begins the message of an evaluation ended by refuse, so
// that eval tells it from the tracker's.
const refusedPrefix = "refused before the call: "

// refuse ends the evaluation with the cost-limit error, as cel-go's
// tracker ends it at the limit (eval turns it into ErrCostLimit), saying
// which call it was and of what.
func refuse(call string, args []ref.Val, limit uint64) {
	panic(interpreter.EvalCancelledError{
		Cause:   interpreter.CostLimitExceeded,
		Message: fmt.Sprintf("%s%s over %s would cost more than the limit of %d", refusedPrefix, call, describeArgs(args), limit),
	})
}

// describeArgs names the kinds and sizes of args, as a refusal says them.
func describeArgs(args []ref.Val) string {
	parts := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case types.String:
			parts[i] = fmt.Sprintf("a string of %d bytes", len(v))
		case types.Bytes:
			parts[i] = fmt.Sprintf("%d bytes", len(v))
		case traits.Mapper:
			parts[i] = fmt.Sprintf("a map of %d entries", celSize(v))
		case traits.Lister:
			parts[i] = fmt.Sprintf("a list of %d", celSize(v))
		case types.Int:
			parts[i] = fmt.Sprint(int64(v))
		case *types.Optional:
			parts[i] = "an optional"
		default:
			parts[i] = "a " + a.Type().TypeName()
		}
	}
	return strings.Join(parts, ", ")
}

// quantityCalls redefine quantity() and isQuantity() so that a quantity
// is parsed only when its text is of a size and exponent a Kubernetes
// quantity has: quantity("1e-999999999") did not return in minutes, its
// cost estimated from the string's 13 bytes.
func quantityCalls() []cel.EnvOption {
	return []cel.EnvOption{
		cel.Function("quantity", cel.Overload("string_to_quantity", []*cel.Type{cel.StringType}, apiservercel.QuantityType,
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				q, err := parseQuantity(v)
				if err != nil {
					return types.WrapErr(err)
				}
				return apiservercel.Quantity{Quantity: &q}
			}))),
		cel.Function("isQuantity", cel.Overload("is_quantity_string", []*cel.Type{cel.StringType}, cel.BoolType,
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				_, err := parseQuantity(v)
				return types.Bool(err == nil)
			}))),
	}
}

// A quantity's text is parsed only within these: a Kubernetes quantity
// is an int64 of nano-units at most, written in a few dozen characters,
// and resource.ParseQuantity takes time exponential in the digits of a
// decimal exponent (it scales by ten to its power).
const (
	maxQuantityLen      = 128
	maxQuantityExponent = 128
)

func parseQuantity(v ref.Val) (resource.Quantity, error) {
	s, ok := v.Value().(string)
	if !ok {
		return resource.Quantity{}, fmt.Errorf("no such overload")
	}
	if len(s) > maxQuantityLen {
		return resource.Quantity{}, fmt.Errorf("quantity: %d characters, more than a quantity has (%d)", len(s), maxQuantityLen)
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 && s[i+1:] != "" && s[i+1:] != "i" {
		exp, err := strconv.ParseInt(s[i+1:], 10, 32)
		if err == nil && (exp > maxQuantityExponent || exp < -maxQuantityExponent) {
			return resource.Quantity{}, fmt.Errorf("quantity %q: the exponent is out of the range a quantity has (±%d)", s, maxQuantityExponent)
		}
	}
	return resource.ParseQuantity(s)
}
