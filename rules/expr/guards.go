package expr

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"k8s.io/apimachinery/pkg/api/resource"
	apiservercel "k8s.io/apiserver/pkg/cel"
)

// Calls whose work grows with their arguments' content faster than
// cel-go can charge for it are bounded before they run. cel-go charges a
// library call's cost once the call has returned, so a call over inputs
// a trigger's author chose ran to the end before the limit could stop it:
// sets.intersects over two lists of 60,000 took 105 s, a list's
// distinct() of 50,000 9 s, before "cost limit exceeded"; and
// quantity("1e-999999999") did not return in minutes, its cost estimated
// from the string's 13 bytes. guardedCalls redefines these overloads (the
// same IDs and signatures, so their cost estimates and trackers stay): a
// call whose work would exceed the cost limit fails at once with the
// error the tracker would give after it, and a quantity is parsed only
// when its text is of a size and exponent a Kubernetes quantity has.
func guardedCalls(limit uint64) []cel.EnvOption {
	list := cel.ListType(cel.TypeParamType("T"))
	pairs := func(name, id string, fn func(a, b traits.Lister) ref.Val) cel.EnvOption {
		return cel.Function(name, cel.Overload(id, []*cel.Type{list, list}, cel.BoolType,
			cel.BinaryBinding(func(a, b ref.Val) ref.Val {
				la, okA := a.(traits.Lister)
				lb, okB := b.(traits.Lister)
				if !okA || !okB {
					return types.MaybeNoSuchOverloadErr(a)
				}
				if err := withinLimit(name, size(la), size(lb), limit); err != nil {
					return err
				}
				return fn(la, lb)
			})))
	}
	return []cel.EnvOption{
		pairs("sets.contains", "list_sets_contains_list", setsContains),
		pairs("sets.intersects", "list_sets_intersects_list", setsIntersects),
		pairs("sets.equivalent", "list_sets_equivalent_list", func(a, b traits.Lister) ref.Val {
			if v := setsContains(a, b); v != types.True {
				return v
			}
			return setsContains(b, a)
		}),
		cel.Function("distinct", cel.MemberOverload("list_distinct", []*cel.Type{list}, list,
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				l, ok := v.(traits.Lister)
				if !ok {
					return types.MaybeNoSuchOverloadErr(v)
				}
				n := size(l)
				if err := withinLimit("distinct", n, n, limit); err != nil {
					return err
				}
				return distinct(l, n)
			}))),
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

func size(l traits.Lister) uint64 { return uint64(l.Size().(types.Int)) }

// withinLimit fails a call that compares each of n elements with each of
// m when that is more than the limit: the cost tracker charges it n×m.
func withinLimit(call string, n, m, limit uint64) ref.Val {
	if n != 0 && m > limit/n {
		return types.WrapErr(fmt.Errorf("%w (limit %d): %s over %d and %d elements would compare more pairs than that", ErrCostLimit, limit, call, n, m))
	}
	return nil
}

// setsContains reports whether every element of sub is in l, as cel-go's
// sets.contains does.
func setsContains(l, sub traits.Lister) ref.Val {
	for it := sub.Iterator(); it.HasNext() == types.True; {
		if v := l.Contains(it.Next()); v != types.True {
			return v
		}
	}
	return types.True
}

// setsIntersects reports whether a and b have an element in common.
func setsIntersects(a, b traits.Lister) ref.Val {
	for it := a.Iterator(); it.HasNext() == types.True; {
		if b.Contains(it.Next()) == types.True {
			return types.True
		}
	}
	return types.False
}

// distinct is l's elements without repeats, first occurrence first, as
// cel-go's distinct() is.
func distinct(l traits.Lister, n uint64) ref.Val {
	out := make([]ref.Val, 0, n)
	for i := range n {
		v := l.Get(types.Int(i))
		seen := false
		for _, u := range out {
			if v.Equal(u) == types.True {
				seen = true
				break
			}
		}
		if !seen {
			out = append(out, v)
		}
	}
	return types.DefaultTypeAdapter.NativeToValue(out)
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
