package expr

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
)

// TestHostileExpressions: expressions nested or long beyond cel-go's
// parser limits are load errors, never a crash.
func TestHostileExpressions(t *testing.T) {
	c := newCompiler(t, Options{})
	for name, tc := range map[string]struct{ src, want string }{
		"nested parentheses": {strings.Repeat("(", 1000) + "true" + strings.Repeat(")", 1000), "expression recursion limit exceeded: 250"},
		"nested lists":       {strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + ".size() > 0", "expression recursion limit exceeded: 250"},
		"huge literal":       {"'" + strings.Repeat("x", 200_000) + "'.size() > 0", "expression code point size exceeds limit: size: 200013, limit 100000"},
	} {
		_, err := c.Compile(tc.src, Scope{}, BoolResult)
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(e.Msg, tc.want) {
			t.Errorf("%s: err = %v, want an *Error saying %q", name, err, tc.want)
		}
	}
}

// TestHostileInputs: objects far deeper or larger than any real one are
// evaluated within the cost limit or stopped by it, never crash.
func TestHostileInputs(t *testing.T) {
	c := newCompiler(t, Options{})
	deep := map[string]any{}
	cur := deep
	for range 10_000 {
		next := map[string]any{}
		cur["a"] = next
		cur = next
	}
	cur["leaf"] = "x"
	big := strings.Repeat("x,", 500_000)
	obj := map[string]any{"deep": deep, "big": big}
	for _, tc := range []struct {
		src     string
		costErr bool
	}{
		{"object.deep.a.a.a.a.a != null", false},
		{"object.deep == object.deep", false},
		{"object.big.size() > 0", false},
		{"object.big.split(',').size() > 0", false}, // as large as its input, no larger
		{"object.big.split(',').map(a, object.big.split(',').map(b, a + b)).size() > 0", true},
	} {
		p, err := c.Compile(tc.src, Scope{}, BoolResult)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		_, err = p.EvalBool(context.Background(), &Activation{Object: obj})
		if got := errors.Is(err, ErrCostLimit); got != tc.costErr {
			t.Errorf("%s: err = %v, want cost limit error %v", tc.src, err, tc.costErr)
		}
	}
}

// countingList is a list of n distinct strings that counts how often it
// is searched: a call charged by the cost tracker only once it has
// returned shows here whether it ran.
type countingList struct {
	traits.Lister
	searched *atomic.Int64
}

func newCountingList(prefix string, n int) countingList {
	l := make([]string, n)
	for i := range l {
		l[i] = fmt.Sprint(prefix, i)
	}
	return countingList{Lister: types.DefaultTypeAdapter.NativeToValue(l).(traits.Lister), searched: &atomic.Int64{}}
}

func (l countingList) Contains(v ref.Val) ref.Val {
	l.searched.Add(1)
	return l.Lister.Contains(v)
}

func (l countingList) Get(i ref.Val) ref.Val {
	l.searched.Add(1)
	return l.Lister.Get(i)
}

// TestHostileCalls: library calls whose work grows with what a trigger
// holds faster than the tracker charges it — each pair of two lists'
// elements compared, a list's each pair — fail with the cost-limit error
// before they run, not after (sets.intersects over 60,000 ran 105 s first),
// and run as before within the limit. A quantity's text is parsed only
// when its size and exponent are a quantity's: "1e-999999999" pinned a
// worker for minutes, its cost estimated from 13 bytes.
func TestHostileCalls(t *testing.T) {
	c := newCompiler(t, Options{})
	eval := func(src string, obj map[string]any) (any, error) {
		t.Helper()
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		return p.Eval(context.Background(), &Activation{Object: obj})
	}
	for _, src := range []string{
		"sets.intersects(object.a, object.b)",
		"sets.contains(object.a, object.b)",
		"sets.equivalent(object.a, object.b)",
		"object.a.distinct().size() > 0",
	} {
		a, b := newCountingList("a", 30_000), newCountingList("b", 30_000)
		_, err := eval(src, map[string]any{"a": a, "b": b})
		if !errors.Is(err, ErrCostLimit) {
			t.Errorf("%s over 30,000 each: err = %v, want the cost limit", src, err)
		}
		// A call that ran searches them at least 30,000 times.
		if n := a.searched.Load() + b.searched.Load(); n >= 100 {
			t.Errorf("%s over 30,000 each: the lists were searched %d times before the limit stopped it", src, n)
		}
		small, other := newCountingList("a", 100), newCountingList("a", 100)
		if _, err := eval(src, map[string]any{"a": small, "b": other}); err != nil {
			t.Errorf("%s over 100 each: %v", src, err)
		}
	}

	for src, want := range map[string]any{
		`quantity("64Gi").isGreaterThan(quantity("1e3"))`: true,
		`quantity("1.5e2").asInteger()`:                   int64(150),
		`quantity("1E").asApproximateFloat()`:             1e18,
		`isQuantity("1Ei")`:                               true,
		`isQuantity("1e999999999")`:                       false,
		`isQuantity("` + strings.Repeat("1", 200) + `")`:  false,
	} {
		if got, err := eval(src, nil); err != nil || got != want {
			t.Errorf("%s = %v, %v; want %v", src, got, err, want)
		}
	}
	for _, src := range []string{
		`quantity("1e-999999999").isLessThan(quantity("64Gi"))`,
		`quantity("64Gi").compareTo(quantity("1e99999999"))`,
		`quantity("1E-999999").add(quantity("1"))`,
	} {
		if _, err := eval(src, nil); err == nil || !strings.Contains(err.Error(), "the exponent is out of the range a quantity has") {
			t.Errorf("%s: err = %v, want the exponent refused", src, err)
		}
	}
}

// configMap is a ConfigMap's data of n keys, each entry 41 bytes: 10,000
// make the 410 KB of the attacker's deepMerge, 16,000 the 646 KB of the
// flatten.
func configMap(n int) map[string]any {
	data := make(map[string]any, n)
	for i := range n {
		data[fmt.Sprintf("key-%06d", i)] = strings.Repeat("v", 30)
	}
	return map[string]any{"data": data}
}

// TestHostileMergeAndFlatten: the finding's expressions, which ran for
// seconds to minutes and gigabytes within the limit — deepMerge charged
// by its result's top-level keys while it merged every nested map,
// flatten by its list's top-level size while it copied every nested
// list — are stopped by the limit: the merges add up to it, the flatten
// is refused before it is made. Within the limit they give what they
// gave.
func TestHostileMergeAndFlatten(t *testing.T) {
	c := newCompiler(t, Options{})
	for _, tc := range []struct {
		src     string
		keys    int
		refused string // the call refused before it is made, or "" (stopped by the tracker)
	}{
		{"lists.range(400).map(i, {'m': object.data}.deepMerge({'m': object.data})).size()", 10_000, ""},
		{"lists.range(400).map(i, object.data.merge(object.data)).size()", 10_000, ""},
		{"cel.bind(keys, object.data.map(k, k), object.data.map(k, keys).flatten().size())", 16_000, "flatten"},
		{"object.data.map(k, object.data.map(j, j)).flatten().size()", 16_000, ""},
		{"cel.bind(a, object.data.map(k, k), cel.bind(b, [a, a, a, a], cel.bind(c, [b, b, b, b], [c, c, c, c].flatten(3).size())))", 16_000, "flatten"},
	} {
		p, err := c.Compile(tc.src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		_, err = p.Eval(context.Background(), &Activation{Object: configMap(tc.keys)})
		if !errors.Is(err, ErrCostLimit) || (tc.refused != "" && !strings.Contains(err.Error(), tc.refused+" over")) {
			t.Errorf("%s over %d keys: err = %v, want the cost limit (refusing %q)", tc.src, tc.keys, err, tc.refused)
		}
	}
	for src, want := range map[string]int64{
		"lists.range(4).map(i, {'m': object.data}.deepMerge({'m': object.data})).size()":   4,
		"{'m': object.data}.deepMerge({'m': {'key-000001': 'x'}}).m.size()":                100,
		"cel.bind(keys, object.data.map(k, k), object.data.map(k, keys).flatten().size())": 100 * 100,
	} {
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if got, err := p.Eval(context.Background(), &Activation{Object: configMap(100)}); err != nil || got != want {
			t.Errorf("%s over 100 keys = %v, %v; want %d", src, got, err, want)
		}
	}
}
