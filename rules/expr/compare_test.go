package expr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/cel-go/common/types"
)

// sharing is an expression that binds a0 to a list (or map) of ten ones
// and each next level to ten references to the one before, to depth
// levels, and evaluates body over them: the level depth-1 holds 10^depth
// ones for the cost of depth small literals.
func sharing(depth int, maps bool, body string) string {
	var b strings.Builder
	for i := range depth {
		elem := "1"
		if i > 0 {
			elem = fmt.Sprintf("a%d", i-1)
		}
		parts := make([]string, 10)
		for j := range parts {
			parts[j] = elem
			if maps {
				parts[j] = fmt.Sprintf("'%c': %s", 'a'+j, elem)
			}
		}
		open, end := "[", "]"
		if maps {
			open, end = "{", "}"
		}
		fmt.Fprintf(&b, "cel.bind(a%d, %s%s%s, ", i, open, strings.Join(parts, ", "), end)
	}
	return b.String() + body + strings.Repeat(")", depth)
}

// TestHostileComparisons: ==, != and in over values that share their
// parts compare at every depth, where cel-go charges them by their
// top-level sizes: a7 == a7 over eight levels took 3 s (a map 14 s and
// 3.5 GB), charged fewer than 400, on the untracked program no deadline
// watches. They are refused before they are made, and the comparisons of
// one evaluation add up to the limit; comparisons within it give what
// they gave.
func TestHostileComparisons(t *testing.T) {
	c := newCompiler(t, Options{})
	eval := func(src string) (any, error) {
		t.Helper()
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%.80s…: %v", src, err)
		}
		return p.Eval(context.Background(), &Activation{Object: map[string]any{}})
	}
	for _, tc := range []struct {
		name string
		src  string
		op   string
	}{
		{"lists ==", sharing(7, false, "a6 == a6"), "=="},
		{"maps ==", sharing(7, true, "a6 == a6"), "=="},
		{"lists !=", sharing(7, false, "a6 != a6"), "!="},
		{"in a list", sharing(7, false, "a6 in [a6]"), "in"},
		{"nested in a literal", sharing(7, false, "{'k': a6} == {'k': a6}"), "=="},
		{"optionals", sharing(7, false, "optional.of(a6) == optional.of(a6)"), "=="},
		{"in a comprehension", sharing(7, false, "[a6].exists(x, x == a6)"), "=="},
		// 111,111 elements each: within the limit one by one, not twenty times.
		{"adding up", sharing(5, false, "lists.range(20).all(i, a4 == a4)"), "=="},
	} {
		_, err := eval(tc.src)
		if !errors.Is(err, ErrCostLimit) || !strings.Contains(err.Error(), tc.op+" over") {
			t.Errorf("%s: err = %v, want the cost limit naming %s", tc.name, err, tc.op)
		}
	}
	for _, tc := range []struct {
		src  string
		want any
	}{
		{sharing(5, false, "lists.range(5).all(i, a4 == a4)"), true},
		{sharing(5, true, "a4 != a4"), false},
		{sharing(4, false, "a2 in a3"), true},
		{sharing(3, false, "[a2, a1] == [a2, a2]"), false},
		{"{'a': [1, [2]]} == {'a': [1, [2]]}", true},
		{"'x' in {'x': [[1]]}", true},
	} {
		if got, err := eval(tc.src); err != nil || got != tc.want {
			t.Errorf("%.80s…: = %v, %v; want %v", tc.src, got, err, tc.want)
		}
	}
}

// TestDeepTypes: a comparison is charged where both operands may hold
// lists or maps, and left to cel-go's charge where one's type says it
// cannot — the charge of a typed field's comparison costs nothing.
func TestDeepTypes(t *testing.T) {
	for _, tc := range []struct {
		t    *types.Type
		want bool
	}{
		{types.StringType, false},
		{types.IntType, false},
		{types.NewListType(types.IntType), false},
		{types.NewMapType(types.StringType, types.StringType), false},
		{types.NewOptionalType(types.NewListType(types.StringType)), false},
		{types.DynType, true},
		{nil, true},
		{types.NewListType(types.NewListType(types.IntType)), true},
		{types.NewMapType(types.StringType, types.DynType), true},
		{types.NewOptionalType(types.NewListType(types.DynType)), true},
		{types.NewListType(types.NewOptionalType(types.NewListType(types.IntType))), true},
	} {
		if got := deep(tc.t); got != tc.want {
			t.Errorf("deep(%v) = %v, want %v", tc.t, got, tc.want)
		}
	}
}
