package expr

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestKroLibrary: kro's CEL functions give what kro's give — the seeded
// strings and numbers the same for the same seed (the values below are
// kro's, so a port keeps the names and passwords kro made) — and leave
// their arguments as they were.
func TestKroLibrary(t *testing.T) {
	c := newCompiler(t, Options{})
	for src, want := range map[string]any{
		"random.seededString(10, 'test-seed')":                                 "5czheg3o5c",
		"random.seededString(20, 'test-seed')":                                 "5czheg3o5czheg3o5czh",
		"random.seededInt(30000, 32768, 'uid-1')":                              int64(30487),
		"random.seededInt(-5, 5, 'x')":                                         int64(1),
		"base64.encode(hash.fnv64a('hello world'))":                            "d5pl5wI80uc=",
		"base64.encode(hash.sha256('a')).size()":                               int64(44),
		"base64.encode(hash.md5('a'))":                                         "DMF1ucDxtqgxw5niaXcmYQ==",
		"json.marshal({'b': [1, 'x'], 'a': true})":                             `{"a":true,"b":[1,"x"]}`,
		"json.unmarshal('{\"n\": 3, \"f\": 1.5}').n + 1":                       int64(4),
		"json.unmarshal('{\"n\": 3, \"f\": 1.5}').f":                           1.5,
		"lists.setAtIndex([1, 2, 3], 1, 9)":                                    []any{int64(1), int64(9), int64(3)},
		"lists.insertAtIndex([1, 2], 2, 3)":                                    []any{int64(1), int64(2), int64(3)},
		"lists.insertAtIndex([1, 2], 0, 0)":                                    []any{int64(0), int64(1), int64(2)},
		"lists.removeAtIndex([1, 2, 3], 0)":                                    []any{int64(2), int64(3)},
		"{'a': 1, 'b': 2}.merge({'b': 3, 'c': 4})":                             map[string]any{"a": int64(1), "b": int64(3), "c": int64(4)},
		"{'a': {'x': 1, 'y': 2}}.deepMerge({'a': {'x': 9}, 'b': [1]})":         map[string]any{"a": map[string]any{"x": int64(9), "y": int64(2)}, "b": []any{int64(1)}},
		"cel.bind(n, 'web', n + '-' + n)":                                      "web-web",
		"cel.bind(l, [1, 2], lists.setAtIndex(l, 0, 5).size() + l[0])":         int64(3),
		"random.seededString(63, 'ns/name').matches('^[0-9a-z]{63}$')":         true,
		"random.seededString(8, 'a') != random.seededString(8, 'b')":           true,
		"json.unmarshal(json.marshal({'k': [1.5, 'v']})) == {'k': [1.5, 'v']}": true,
	} {
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Errorf("Compile(%q): %v", src, err)
			continue
		}
		got, err := p.Eval(context.Background(), &Activation{})
		if err != nil || !equal(got, want) {
			t.Errorf("Eval(%q) = %#v, %v; want %#v", src, got, err, want)
		}
	}
	for src, want := range map[string]string{
		"random.seededString(0, 'x')":       "length must be positive",
		"random.seededInt(5, 5, 'x')":       "min 5 must be less than max 5",
		"lists.setAtIndex([1], 1, 2)":       "index 1 out of range for a list of 1",
		"lists.insertAtIndex([1], 2, 2)":    "index 2 out of range",
		"lists.removeAtIndex([], 0)":        "index 0 out of range for a list of 0",
		"json.unmarshal('{')":               "json.unmarshal: unexpected EOF",
		"json.unmarshal('1 2')":             "more than one JSON value",
		"random.seededString(2000000, 'x')": "cost limit exceeded",
	} {
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Errorf("Compile(%q): %v", src, err)
			continue
		}
		if _, err := p.Eval(context.Background(), &Activation{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Eval(%q): %v, want an error with %q", src, err, want)
		}
	}
}

// TestKroLibraryCosts: kro's functions are charged by the work they do,
// so a comprehension that calls them over a large value stops at the
// cost limit — each call would otherwise count as one step.
func TestKroLibraryCosts(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 100_000})
	big := strings.Repeat("x", 10_000)
	for _, src := range []string{
		"lists.range(100).all(i, hash.sha256(object.s).size() > 0)",
		"lists.range(100).all(i, json.marshal(object.s).size() > 0)",
		"lists.range(100).all(i, random.seededString(5000, object.s).size() > 0)",
		"lists.range(100).all(i, json.unmarshal(object.j).size() > 0)",
	} {
		p, err := c.Compile(src, Scope{}, BoolResult)
		if err != nil {
			t.Fatalf("Compile(%q): %v", src, err)
		}
		obj := map[string]any{"s": big, "j": `"` + big + `"`}
		if _, err := p.EvalBool(context.Background(), &Activation{Object: obj}); !errors.Is(err, ErrCostLimit) {
			t.Errorf("%s over 10 kB, limit 100,000: err = %v, want the cost limit", src, err)
		}
		// A tenth of it is within the limit: the size, not the call,
		// is charged.
		obj = map[string]any{"s": big[:100], "j": `"` + big[:100] + `"`}
		small := strings.Replace(src, "5000", "50", 1)
		p, _ = c.Compile(small, Scope{}, BoolResult)
		if ok, err := p.EvalBool(context.Background(), &Activation{Object: obj}); err != nil || !ok {
			t.Errorf("%s over 100 bytes: %v, %v; want true within the limit", small, ok, err)
		}
	}
}
