package expr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
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

// A refused expression fails with the cost limit naming op; a given one
// evaluates to want.
type (
	refused struct{ name, src, op string }
	given   struct {
		src  string
		want any
	}
)

// checkHostile evaluates each expression, of no input, under the default
// limit and a render's budget, and checks what it gives.
func checkHostile(t *testing.T, refusals []refused, givens []given) {
	t.Helper()
	c := newCompiler(t, Options{})
	eval := func(src string) (any, error) {
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%.80s…: %v", src, err)
		}
		return p.Eval(context.Background(), &Activation{Object: map[string]any{}, Budget: NewBudget(128 << 20)})
	}
	for _, tc := range refusals {
		if _, err := eval(tc.src); !errors.Is(err, ErrCostLimit) || !strings.Contains(err.Error(), tc.op+" over") {
			t.Errorf("%s: err = %v, want the cost limit naming %s", tc.name, err, tc.op)
		}
	}
	for _, tc := range givens {
		if got, err := eval(tc.src); err != nil || got != tc.want {
			t.Errorf("%.80s…: = %v, %v; want %v", tc.src, got, err, tc.want)
		}
	}
}

// TestHostileComparisons: ==, != and in over values that share their
// parts compare at every depth, where cel-go charges them by their
// top-level sizes: a7 == a7 over eight levels took 3 s (a map 14 s and
// 3.5 GB), charged fewer than 400, on the untracked program no deadline
// watches. They are refused before they are made, and the comparisons of
// one evaluation add up to the limit; comparisons within it give what
// they gave.
func TestHostileComparisons(t *testing.T) {
	checkHostile(t, []refused{
		{"lists ==", sharing(7, false, "a6 == a6"), "=="},
		{"maps ==", sharing(7, true, "a6 == a6"), "=="},
		{"lists !=", sharing(7, false, "a6 != a6"), "!="},
		{"in a list", sharing(7, false, "a6 in [a6]"), "in"},
		{"nested in a literal", sharing(7, false, "{'k': a6} == {'k': a6}"), "=="},
		{"optionals", sharing(7, false, "optional.of(a6) == optional.of(a6)"), "=="},
		{"in a comprehension", sharing(7, false, "[a6].exists(x, x == a6)"), "=="},
		// 111,111 elements each: within the limit one by one, not twenty times.
		{"adding up", sharing(5, false, "lists.range(20).all(i, a4 == a4)"), "=="},
	}, []given{
		{sharing(5, false, "lists.range(5).all(i, a4 == a4)"), true},
		{sharing(5, true, "a4 != a4"), false},
		{sharing(4, false, "a2 in a3"), true},
		{sharing(3, false, "[a2, a1] == [a2, a2]"), false},
		{"{'a': [1, [2]]} == {'a': [1, [2]]}", true},
		{"'x' in {'x': [[1]]}", true},
	})
}

// TestDeepTypes: ==, != are charged where both operands may be lists or
// maps, in where its container may be, and a + that may make a list is
// made flat; a comparison of two strings or numbers is cel-go's to charge.
func TestDeepTypes(t *testing.T) {
	for _, tc := range []struct {
		t          *types.Type
		deep, list bool
	}{
		{types.StringType, false, false},
		{types.IntType, false, false},
		{types.NewOptionalType(types.StringType), false, false},
		{types.NewListType(types.IntType), true, true},
		{types.NewMapType(types.StringType, types.StringType), true, false},
		{types.NewOptionalType(types.NewListType(types.StringType)), true, false},
		{types.DynType, true, true},
		{nil, true, true},
	} {
		if got := deep(tc.t); got != tc.deep {
			t.Errorf("deep(%v) = %v, want %v", tc.t, got, tc.deep)
		}
		if got := mayList(tc.t); got != tc.list {
			t.Errorf("mayList(%v) = %v, want %v", tc.t, got, tc.list)
		}
	}
}

// doubling binds a0 to first and each next level to the one before
// added to itself, to depth levels, and evaluates body over them.
func doubling(depth int, first, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "cel.bind(a0, %s, ", first)
	for i := 1; i < depth; i++ {
		fmt.Fprintf(&b, "cel.bind(a%d, a%d + a%d, ", i, i-1, i-1)
	}
	return b.String() + body + strings.Repeat(")", depth)
}

// TestHostileConcatenation: cel-go makes a + b a lazy list charged 1, so
// doubling a list 24 times made 16 million elements for a charge of 24:
// a sort of them copied 8 million and took 13 s and 673 MB before it was
// charged, a == over them 8.9 s untracked, and lists of one long string
// compared 2.4 s charged 0.1 an element. The list + makes is flat and
// counted; lists of strings are compared by what they hold; a
// comprehension's list still grows in place.
func TestHostileConcatenation(t *testing.T) {
	// s16 and t16: two strings of 655,361 bytes, in lists of 20.
	strs := func(body string) string {
		return doubling(17, "'ssssssssss'", "cel.bind(s, a16 + 'z', cel.bind(t, a16 + 'z', "+body+"))")
	}
	twenty := func(v string) string { return "[" + strings.TrimSuffix(strings.Repeat(v+", ", 20), ", ") + "]" }
	checkHostile(t, []refused{
		{"sort", doubling(24, "[1000]", "size(a23.sort())"), "+"},
		{"slice", doubling(25, "[1000]", "size(a24.slice(0, 16000000))"), "+"},
		{"==", doubling(26, "[1]", "a25 == a25"), "+"},
		{"in", doubling(28, "[1]", "2 in a27"), "+"},
		{"lists of strings", strs(twenty("s") + " == " + twenty("t")), "=="},
		{"a string in a list", strs("s in " + twenty("t")), "in"},
	}, []given{
		{doubling(10, "[1]", "size(a9.sort())"), int64(512)},
		{doubling(10, "[1]", "a9 == a9 && 1 in a9 && !(2 in a9)"), true},
		{"lists.range(50000).map(i, i).size()", int64(50000)},
		{"[1, 2] + [3] == [1, 2, 3]", true},
		{"'a' in ['b', 'a']", true},
	})
}

// hugeList claims 2^60 elements and holds none: what a list of shared
// parts may hold.
type hugeList struct{ traits.Lister }

func (hugeList) Size() ref.Val { return types.Int(1 << 60) }

// TestToNativeHuge: a list too large to count is too large, not a sum
// that wraps and a slice that cannot be made (a panic: "makeslice: cap
// out of range").
func TestToNativeHuge(t *testing.T) {
	_, err := toNative(hugeList{types.NewDynamicList(types.DefaultTypeAdapter, []any{})}, NewBudget(128<<20))
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("toNative of 2^60 elements: err = %v, want ErrTooLarge", err)
	}
}
