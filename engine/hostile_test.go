package engine

import (
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
func TestHostileTriggers(t *testing.T) {
	h := newHarness(t)
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
