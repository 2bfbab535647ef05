package expr

import (
	"context"
	"errors"
	"strings"
	"testing"
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
