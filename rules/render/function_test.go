package render

import (
	"strings"
	"testing"
)

// TestDecodeOutput: a function's output read once, integers as int64 as
// the API machinery has them; anything but {"children": [objects]} is
// refused, saying what.
func TestDecodeOutput(t *testing.T) {
	children, err := decodeOutput([]byte(`{"children": [{"kind": "ConfigMap", "spec": {"replicas": 3, "ratio": 0.5}}]}`), nil)
	if err != nil || len(children) != 1 {
		t.Fatalf("children %v, %v", children, err)
	}
	spec := children[0]["spec"].(map[string]any)
	if _, ok := spec["replicas"].(int64); !ok {
		t.Errorf("replicas is %T, want int64", spec["replicas"])
	}
	if _, ok := spec["ratio"].(float64); !ok {
		t.Errorf("ratio is %T, want float64", spec["ratio"])
	}
	if children, err := decodeOutput([]byte(`{"children": null}`), nil); err != nil || len(children) != 0 {
		t.Errorf("no children: %v, %v", children, err)
	}
	for out, want := range map[string]string{
		`"not an object"`:               "cannot unmarshal",
		`{"children": [], "status": 1}`: `unknown field "status"`,
		`{"children": {"a": 1}}`:        "children is a mapping, not a list",
		`{"children": [1]}`:             "children[0] is 1, not an object",
	} {
		if _, err := decodeOutput([]byte(out), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", out, err, want)
		}
	}
}
