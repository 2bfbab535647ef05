package engine

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/rules"
)

// createOnceRule copies each ConfigMap labelled once twice: once, made
// once and left alone, and kept, kept as the template says. A trigger
// with data off: "true" is not a trigger.
const createOnceRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: once}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: once}
  when: "object.?data.?off.orValue('') != 'true'"
  resources:
    - id: once
      createOnce: true
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-once"}
        data: {v: "${object.data.v}"}
    - id: kept
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-kept"}
        data: {v: "${object.data.v}"}
`

// TestCreateOnce: a createOnce child is created with the trigger's
// values, then never updated — not by the trigger's change, not to undo
// another writer's — and once deleted it is not created again, across a
// restart of syncloop (the trigger remembers it); the trigger's other
// child follows every change meanwhile. A trigger that stops being one
// forgets it: when it is one again, the child is created again, once. A
// dry run plans nothing for a child made once, there or deleted.
//
// API server: server-side apply's create-only precondition and another
// writer's field manager.
func TestCreateOnce(t *testing.T) {
	h := newHarness(t)
	set := h.loadRules(createOnceRule)
	h.start(set)
	h.createCM("t", map[string]string{"once": "yes"}, map[string]string{"v": "1"})
	holds := func(name, v string) func() bool {
		return func() bool { cm, ok := h.configMap(h.ns, name); return ok && cm.Data["v"] == v }
	}
	h.eventually("both children at v=1", func() bool { return holds("t-once", "1")() && holds("t-kept", "1")() })
	memory := func() string {
		cm, _ := h.configMap(h.ns, "t")
		return cm.Annotations[rules.CreatedOnceKey("once")]
	}
	h.eventually("the trigger to remember the child", func() bool { return memory() == "once/ConfigMap./"+h.ns+"/t-once" })

	setV := func(v string) {
		h.updateCM("t", func(cm *corev1.ConfigMap) { cm.Data["v"] = v })
		h.eventually("the kept child at v="+v, holds("t-kept", v))
	}
	setV("2")
	if !holds("t-once", "1")() {
		t.Errorf("the created-once child was updated with the trigger")
	}
	h.updateCM("t-once", func(cm *corev1.ConfigMap) { cm.Data["v"] = "theirs" })
	setV("3")
	if !holds("t-once", "theirs")() {
		t.Errorf("another writer's change to the created-once child was undone")
	}
	if w := h.writesTo("configmaps", h.ns, "t-once"); len(w) != 1 {
		t.Errorf("%d writes by syncloop to the created-once child, want its create: %v", len(w), w)
	}

	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "t-once", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	setV("4")
	h.stop()
	h.start(set)
	setV("5")
	if _, ok := h.configMap(h.ns, "t-once"); ok {
		t.Fatalf("the created-once child, deleted, was created again")
	}

	// A dry run: u's child made once holds another writer's value, t's is
	// deleted; only the kept children are planned.
	h.createCM("u", map[string]string{"once": "yes"}, map[string]string{"v": "1"})
	h.eventually("u's child made once", holds("u-once", "1"))
	h.updateCM("u-once", func(cm *corev1.ConfigMap) { cm.Data["v"] = "theirs" })
	h.stop()
	planner := &recordingPlanner{}
	h.plan = planner
	h.updateCM("t", func(cm *corev1.ConfigMap) { cm.Data["v"] = "6" })
	h.updateCM("u", func(cm *corev1.ConfigMap) { cm.Data["v"] = "6" })
	h.start(set)
	h.eventually("the kept children's updates planned", func() bool { return planner.count(ActionUpdate) >= 2 })
	planner.mu.Lock()
	for _, a := range planner.actions {
		if strings.HasSuffix(a.Object.Name, "-once") {
			t.Errorf("planned %s of %s, a child made once", a.Action, a.Object.Name)
		}
	}
	planner.mu.Unlock()
	h.stop()
	h.plan = nil
	h.start(set)

	h.updateCM("t", func(cm *corev1.ConfigMap) { cm.Data["off"] = "true" })
	h.eventually("the trigger that is none to forget", func() bool { return memory() == "" })
	h.updateCM("t", func(cm *corev1.ConfigMap) { delete(cm.Data, "off"); cm.Data["v"] = "7" })
	h.eventually("the child created again, at v=7, once a trigger again", holds("t-once", "7"))
}
