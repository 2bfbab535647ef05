package engine

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
)

// patchRule labels the ConfigMap "target" (which it does not own) for every
// ConfigMap labelled app, and marks the test's namespace as having apps.
const patchRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mark}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: app}
  resources:
    - id: target
      mode: patch
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: target
          labels: {"seen-${object.metadata.name}": "yes"}
        data: {last: "${object.metadata.name}"}
    - id: namespace
      mode: patch
      template:
        apiVersion: v1
        kind: Namespace
        metadata:
          name: ${object.metadata.namespace}
          labels: {has-apps: "true"}
  resyncPeriod: "0"
`

// TestPatchMode: a patch never creates its object and waits for it; once
// the object appears it is patched, without syncloop's labels, annotations
// or ownerReferences; drift in the patched fields is repaired; a deleted
// trigger's fields are released and the object stays; a field two triggers
// set stays until both are gone. At steady state nothing is written.
//
// API server: server-side apply of a patch onto an object another manager
// owns, and field ownership.
func TestPatchMode(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(patchRule))
	c := h.loop("mark")
	namespaceLabel := func() string {
		ns, err := h.cs.CoreV1().Namespaces().Get(context.Background(), h.ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ns.Labels["has-apps"]
	}

	h.createCM("a", map[string]string{"app": "yes"}, nil)
	h.eventually("the namespace patched", func() bool { return namespaceLabel() == "true" })
	h.eventually("the trigger reconciled and idle", c.idle)
	if _, ok := h.configMap(h.ns, "target"); ok {
		t.Fatal("a patch created the object it patches")
	}

	// The object appears: it is patched at once (no resync: the watch).
	h.createCM("target", map[string]string{"owner": "someone-else"}, map[string]string{"theirs": "1"})
	patched := func(cm *corev1.ConfigMap, trigger string) bool {
		return cm.Labels["seen-"+trigger] == "yes" && cm.Data["theirs"] == "1" && cm.Labels["owner"] == "someone-else"
	}
	h.eventually("the late object patched", func() bool {
		cm, ok := h.configMap(h.ns, "target")
		return ok && patched(cm, "a") && cm.Data["last"] == "a"
	})
	cm, _ := h.configMap(h.ns, "target")
	if len(cm.OwnerReferences) != 0 || cm.Labels[rules.LabelManagedBy] != "" || cm.Labels[rules.LabelRule] != "" || cm.Annotations[rules.AnnotationOwner] != "" {
		t.Errorf("a patch added syncloop's metadata: labels %v, annotations %v, ownerReferences %v", cm.Labels, cm.Annotations, cm.OwnerReferences)
	}

	// Drift in a patched field is repaired; other fields are not touched.
	h.updateCM("target", func(cm *corev1.ConfigMap) { cm.Data["last"] = "edited"; cm.Data["theirs"] = "2" })
	h.eventually("the drift repaired", func() bool {
		cm, _ := h.configMap(h.ns, "target")
		return cm.Data["last"] == "a" && cm.Data["theirs"] == "2"
	})

	// Steady state: reconciles write nothing — once the loop's cache
	// holds the repaired object (the API server may answer first).
	h.eventually("idle, the cache caught up", func() bool {
		live, _ := h.configMap(h.ns, "target")
		cached, ok, _ := c.watches.patchWatchOf(c.rule.Resources[0]).sub.Indexer().GetByKey(h.ns + "/target")
		return c.idle() && ok && cached.(object).GetResourceVersion() == live.ResourceVersion
	})
	h.counter.Reset()
	c.queue.Add(cache.ObjectName{Namespace: h.ns, Name: "a"})
	h.eventually("reconciled again", c.idle)
	for _, r := range h.counter.Requests(nil) {
		if r.IsWrite() {
			t.Errorf("a reconcile at steady state wrote: %s %s", r.Method, r.Path)
		}
	}

	// A second trigger shares the namespace label; deleting the first
	// releases its fields: its label goes, the shared one stays, the
	// object stays.
	h.createCM("b", map[string]string{"app": "yes"}, nil)
	h.eventually("b's patch", func() bool {
		cm, _ := h.configMap(h.ns, "target")
		return cm.Labels["seen-b"] == "yes"
	})
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("a's fields released", func() bool {
		cm, ok := h.configMap(h.ns, "target")
		return ok && cm.Labels["seen-a"] == "" && cm.Labels["seen-b"] == "yes" && cm.Labels["owner"] == "someone-else"
	})
	if namespaceLabel() != "true" {
		t.Error("the label both triggers set went with the first")
	}
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("every field released", func() bool {
		cm, ok := h.configMap(h.ns, "target")
		_, hasLast := cm.Data["last"]
		return ok && cm.Labels["seen-b"] == "" && !hasLast && cm.Data["theirs"] == "2" && namespaceLabel() == ""
	})
}

const targetOnlyRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mark}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: app}
  when: "object.?data.?off.orValue('') != 'yes'"
  resources:
    - id: target
      mode: patch
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: target
          labels: {"seen-${object.metadata.name}": "yes"}
`

// TestPatchReleased: the fields are released when `when` turns false, when
// a changed rule no longer has the resource, and when the trigger was
// deleted while syncloop was not running.
//
// API server: server-side apply releasing fields (an empty apply) and
// managedFields.
func TestPatchReleased(t *testing.T) {
	h := newHarness(t)
	h.createCM("target", nil, nil)
	h.createCM("a", map[string]string{"app": "yes"}, nil)
	seen := func(trigger string) bool {
		cm, ok := h.configMap(h.ns, "target")
		if !ok {
			t.Fatal("the patched object is gone")
		}
		return cm.Labels["seen-"+trigger] == "yes"
	}
	h.start(h.loadRules(targetOnlyRule))
	h.eventually("patched", func() bool { return seen("a") })

	h.updateCM("a", func(cm *corev1.ConfigMap) { cm.Data = map[string]string{"off": "yes"} })
	h.eventually("released when `when` turns false", func() bool { return !seen("a") })
	h.updateCM("a", func(cm *corev1.ConfigMap) { cm.Data = nil })
	h.eventually("patched again", func() bool { return seen("a") })

	// The rule changes and no longer patches: released.
	h.engine.Enforce(t.Context(), h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mark}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: app}
  resources:
    - id: other
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-other"}}
`))
	h.eventually("released when the rule drops the resource", func() bool { return !seen("a") })
	h.engine.Enforce(t.Context(), h.loadRules(targetOnlyRule))
	h.eventually("patched once more", func() bool { return seen("a") })

	// Deleted while syncloop is down: released when it starts again.
	h.stop()
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.start(h.loadRules(targetOnlyRule))
	h.eventually("released after the restart", func() bool { return !seen("a") })
}

// TestPatchDryRun: a dry run plans a patch as an update of the object, with
// the diff of the patched fields, and writes nothing.
//
// API server: server-side dry-run requests of a patch.
func TestPatchDryRun(t *testing.T) {
	h := newHarness(t)
	planner := &recordingPlanner{}
	h.plan = planner
	h.createCM("target", nil, nil)
	h.createCM("a", map[string]string{"app": "yes"}, nil)
	h.start(h.loadRules(targetOnlyRule))
	h.eventually("a planned update", func() bool { return planner.count(ActionUpdate) == 1 })
	planner.mu.Lock()
	a := planner.actions[0]
	planner.mu.Unlock()
	if a.Object.Name != "target" || !strings.Contains(a.Diff, "+    seen-a: \"yes\"") {
		t.Errorf("planned %+v; want an update of target adding the label", a)
	}
	if cm, _ := h.configMap(h.ns, "target"); cm.Labels["seen-a"] != "" {
		t.Error("a dry run patched the object")
	}
}
