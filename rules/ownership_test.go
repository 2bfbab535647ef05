package rules

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// Label, Annotation and Labels read an unstructured object in place, and
// say what GetLabels and GetAnnotations would, for every shape metadata
// can take — and for typed objects too.
func TestMetaInPlace(t *testing.T) {
	full := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{"team": "a", "empty": ""},
		"annotations": map[string]any{"syncloop.dev/owner": "v1/ConfigMap/ns/x", "blank": ""},
	}}}
	typed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{"team": "a", "empty": ""},
		Annotations: map[string]string{"syncloop.dev/owner": "v1/ConfigMap/ns/x", "blank": ""},
	}}
	for name, obj := range map[string]metav1.Object{"unstructured": full, "typed": typed} {
		if got := Label(obj, "team"); got != "a" {
			t.Errorf("%s: Label team = %q, want a", name, got)
		}
		if got := Label(obj, "missing"); got != "" {
			t.Errorf("%s: Label missing = %q", name, got)
		}
		if got := Annotation(obj, AnnotationOwner); got != "v1/ConfigMap/ns/x" {
			t.Errorf("%s: Annotation owner = %q", name, got)
		}
		if v, ok := LookupAnnotation(obj, "blank"); !ok || v != "" {
			t.Errorf("%s: LookupAnnotation blank = %q, %v; want present and empty", name, v, ok)
		}
		if _, ok := LookupAnnotation(obj, "missing"); ok {
			t.Errorf("%s: LookupAnnotation missing is present", name)
		}
		l := Labels(obj)
		if !l.Has("empty") || l.Has("missing") || l.Get("team") != "a" {
			t.Errorf("%s: Labels = has empty %v, has missing %v, team %q", name, l.Has("empty"), l.Has("missing"), l.Get("team"))
		}
		for sel, want := range map[string]bool{"team=a": true, "team=b": false, "empty": true, "!empty": false, "missing": false, "!missing": true} {
			s, err := labels.Parse(sel)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Matches(l); got != want {
				t.Errorf("%s: %q matches = %v, want %v", name, sel, got, want)
			}
		}
	}
	// No metadata, no labels, labels of the wrong shape: nothing, no panic.
	for _, obj := range []*unstructured.Unstructured{
		{Object: map[string]any{}},
		{Object: map[string]any{"metadata": map[string]any{}}},
		{Object: map[string]any{"metadata": "x"}},
		{Object: map[string]any{"metadata": map[string]any{"labels": map[string]any{"team": 1}, "annotations": []any{}}}},
	} {
		if Label(obj, "team") != "" || Annotation(obj, AnnotationOwner) != "" || Labels(obj).Has("team") {
			t.Errorf("%v: read a label or annotation from nothing", obj.Object)
		}
	}
}
