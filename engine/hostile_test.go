package engine

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestHostileTriggers: a trigger whose list turns a rule's expression into
// a cost bomb fails alone with the cost-limit error, while the same rule's
// ordinary triggers and another rule carry on; a trigger near the API
// server's size limit and one nested 500 levels deep are reconciled like
// any other.
//
// API server: large objects and lists as the server stores them.
func TestHostileTriggers(t *testing.T) {
	h := newHarness(t)
	h.alone = true // its triggers cost the process its CPU for seconds
	ctx := t.Context()
	if _, err := h.env.InstallCRDs(ctx, filepath.Join("testdata", "widgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: pairs}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: pairs}
  variables:
    - name: items
      expression: "object.data.items.split(',')"
  resources:
    - id: count
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-pairs"}
        data: {n: "${string(variables.items.map(a, variables.items.map(b, a + b)).size())}"}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: widget-copy}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  resources:
    - id: copy
      template:
        apiVersion: test.syncloop.dev/v1
        kind: Widget
        metadata: {name: "${object.metadata.name}-copy"}
        spec: ${object.spec}
---
` + copyRule))
	pairs := map[string]string{"pairs": "yes"}
	h.createCM("small", pairs, map[string]string{"items": "a,b,c"})
	h.createCM("bomb", pairs, map[string]string{"items": strings.TrimSuffix(strings.Repeat("x,", 5000), ",")})
	// Evaluating up to the cost limit takes 11 s under the race detector
	// on an idle 2-core machine; the suite runs packages side by side.
	h.waitForFailedWithin(2*time.Minute, "bomb", "CEL cost limit exceeded")
	h.eventually("the small trigger's child", func() bool {
		cm, ok := h.configMap(h.ns, "small-pairs")
		return ok && cm.Data["n"] == "3"
	})
	if _, ok := h.configMap(h.ns, "bomb-pairs"); ok {
		t.Error("the bomb rendered")
	}

	// Near the size limit: a ConfigMap of 1,000,000 bytes of data.
	big := strings.Repeat("0123456789", 100_000)
	h.createCM("big", map[string]string{"copy": "yes"}, map[string]string{"big": big})
	h.eventually("the big trigger's copy", func() bool {
		cm, ok := h.configMap(h.ns, "big-copy")
		return ok && cm.Data["big"] == big
	})

	// 500 levels deep.
	spec := map[string]any{"leaf": "x"}
	for range 500 {
		spec = map[string]any{"a": spec}
	}
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.syncloop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "deep", "namespace": h.ns},
		"spec":     spec,
	}}
	widgetsNS := h.dynamic().Resource(widgets).Namespace(h.ns)
	if _, err := widgetsNS.Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the deep trigger's copy", func() bool {
		c, err := widgetsNS.Get(ctx, "deep-copy", metav1.GetOptions{})
		if err != nil {
			return false
		}
		path := make([]string, 0, 502)
		path = append(path, "spec")
		for range 500 {
			path = append(path, "a")
		}
		leaf, _, _ := unstructured.NestedString(c.Object, append(path, "leaf")...)
		return leaf == "x"
	})

	// Another trigger of the bomb's rule is still served promptly.
	h.createCM("after", pairs, map[string]string{"items": "a,b"})
	h.eventually("a later trigger of the same rule", func() bool {
		cm, ok := h.configMap(h.ns, "after-pairs")
		return ok && cm.Data["n"] == "2"
	})
	for _, s := range h.engine.States() {
		if s.State != StateRunning {
			t.Errorf("rule %s is %s", s.Rule, s.State)
		}
	}
}

// TestHostileSizes: a trigger near the API server's size limit whose rule
// copies it over and over, and a forEach over more items than one trigger
// may have children, each fail their trigger with a bounded, named error
// before anything is written; the rule's other triggers and another rule
// carry on.
//
// API server: the server's request size limit (3 MiB of etcd object).
func TestHostileSizes(t *testing.T) {
	h := newHarness(t)
	h.alone = true // its triggers cost the process its CPU for seconds
	ctx := t.Context()
	if _, err := h.env.InstallCRDs(ctx, filepath.Join("testdata", "widgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: fan}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  variables:
    - name: copies
      expression: "dyn(object).spec.?items.orValue([]).map(i, dyn(object).spec.?cfg.orValue({}))"
  resources:
    - id: each
      forEach: "dyn(object).spec.?items.orValue([])"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${item}"}
        data: {copies: "${string(size(variables.copies))}"}
---
` + copyRule))
	widgetsNS := h.dynamic().Resource(widgets).Namespace(h.ns)
	create := func(name string, spec map[string]any) {
		t.Helper()
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "test.syncloop.dev/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name, "namespace": h.ns}, "spec": spec}}
		if _, err := widgetsNS.Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	items := func(n int) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = fmt.Sprint(i)
		}
		return out
	}
	// 1.4 MB: 12,000 entries of 100 bytes, copied once per item.
	cfg := map[string]any{}
	for i := range 12_000 {
		cfg[fmt.Sprintf("k%05d", i)] = strings.Repeat("v", 100)
	}
	create("big", map[string]any{"cfg": cfg, "items": items(200)})
	create("wide", map[string]any{"items": items(10_001)})
	create("small", map[string]any{"cfg": map[string]any{"a": "b"}, "items": items(2)})

	h.waitForFailedWithin(time.Minute, "big", "would hold more than 128 MiB")
	h.waitForFailedWithin(time.Minute, "wide", "10001 children, more than the 10000 one trigger may have")
	h.eventually("the small trigger's children", func() bool {
		cm, ok := h.configMap(h.ns, "small-1")
		return ok && cm.Data["copies"] == "2"
	})
	for _, name := range []string{"big-0", "wide-0"} {
		if _, ok := h.configMap(h.ns, name); ok {
			t.Errorf("%s was written", name)
		}
	}
	h.createCM("c", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.eventually("another rule's child", func() bool { _, ok := h.configMap(h.ns, "c-copy"); return ok })
}
