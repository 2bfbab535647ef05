package engine

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
)

func TestHolds(t *testing.T) {
	live := map[string]any{
		"metadata": map[string]any{"name": "a", "labels": map[string]any{"x": "1", "extra": "y"}, "resourceVersion": "7"},
		"spec": map[string]any{
			"replicas": int64(3), "ratio": 0.5, "on": true, "none": nil,
			"containers": []any{map[string]any{"name": "app", "image": "nginx", "terminationMessagePath": "/dev/x"}},
		},
	}
	tests := []struct {
		name    string
		desired any
		want    bool
	}{
		{"subset of maps", map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "1"}}}, true},
		{"defaulted fields in list items", map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "app", "image": "nginx"}}}}, true},
		{"int equals float", map[string]any{"spec": map[string]any{"replicas": 3.0, "ratio": 0.5}}, true},
		{"bool and null", map[string]any{"spec": map[string]any{"on": true, "none": nil}}, true},
		{"changed value", map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "2"}}}, false},
		{"missing key", map[string]any{"spec": map[string]any{"paused": true}}, false},
		{"list length", map[string]any{"spec": map[string]any{"containers": []any{}}}, false},
		{"list item differs", map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"image": "httpd"}}}}, false},
		{"type differs", map[string]any{"spec": map[string]any{"replicas": "3"}}, false},
		{"int differs", map[string]any{"spec": map[string]any{"replicas": int64(4)}}, false},
		{"map where scalar", map[string]any{"metadata": map[string]any{"name": map[string]any{}}}, false},
	}
	for _, tt := range tests {
		if got := holds(live, tt.desired); got != tt.want {
			t.Errorf("%s: holds = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestContentHash(t *testing.T) {
	a := map[string]any{"data": map[string]any{"k": "v", "j": "w"}}
	b := map[string]any{"data": map[string]any{"j": "w", "k": "v"}}
	if contentHash(a) != contentHash(b) || len(contentHash(a)) != 16 {
		t.Errorf("hash depends on map order or has the wrong length: %s %s", contentHash(a), contentHash(b))
	}
	c := map[string]any{"data": map[string]any{"k": "v"}}
	if contentHash(a) == contentHash(c) {
		t.Error("removing a field kept the hash")
	}
}

// TestDifference names the first field live does not hold, as holds
// decides it.
func TestDifference(t *testing.T) {
	desired := map[string]any{"spec": map[string]any{"replicas": int64(3), "ports": []any{map[string]any{"port": int64(80)}}}, "a": "x"}
	for _, c := range []struct {
		live any
		want string
	}{
		{map[string]any{"spec": map[string]any{"replicas": float64(3), "ports": []any{map[string]any{"port": int64(80), "name": "h"}}, "more": true}, "a": "x"}, ""},
		{map[string]any{"spec": map[string]any{"replicas": int64(2), "ports": []any{map[string]any{"port": int64(80)}}}, "a": "x"}, ".spec.replicas"},
		{map[string]any{"spec": map[string]any{"replicas": int64(3), "ports": []any{map[string]any{"port": int64(81)}}}, "a": "x"}, ".spec.ports[0].port"},
		{map[string]any{"spec": map[string]any{"replicas": int64(3), "ports": []any{}}, "a": "x"}, ".spec.ports"},
		{map[string]any{"spec": "no"}, ".a"},
		{"scalar", "."},
	} {
		if got := Difference(c.live, desired); got != c.want {
			t.Errorf("Difference(%v) = %q, want %q", c.live, got, c.want)
		}
	}
}

// TestDrift: a child is in sync when it carries the hash of what the rule
// renders and holds its fields, or differs only where the rule's own
// apply was the last write (a field the API server rewrites).
func TestDrift(t *testing.T) {
	desired := map[string]any{"apiVersion": "v1", "kind": "Secret", "stringData": map[string]any{"p": "x"}}
	child := func(hash string, managers ...string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"p": "eA=="}}}
		u.SetAnnotations(map[string]string{rules.AnnotationAppliedHash: hash})
		var mfs []metav1.ManagedFieldsEntry
		for i, m := range managers {
			at := metav1.NewTime(time.Unix(int64(1000+i), 0))
			mfs = append(mfs, metav1.ManagedFieldsEntry{Manager: m, Time: &at})
		}
		u.SetManagedFields(mfs)
		return u
	}
	hash := contentHash(desired)
	for _, c := range []struct {
		name string
		live *unstructured.Unstructured
		want string
	}{
		{"last written by the rule", child(hash, "someone", "syncloop/r"), ""},
		{"written since by someone", child(hash, "syncloop/r", "someone"), "stringData differs from the rule"},
		{"another version of the rule", child("0123", "syncloop/r"), "applied from another version of the rule"},
	} {
		if got := Drift(c.live, desired, "syncloop/r"); got != c.want {
			t.Errorf("%s: Drift = %q, want %q", c.name, got, c.want)
		}
	}
}
