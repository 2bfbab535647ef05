package engine

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// storeRule keeps each ConfigMap labelled store's settings in a
// ConfigMap or, when its data.kind says so, a Secret: a kind the
// trigger picks among those the resource lists.
const storeRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: store}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: store}
  resources:
    - id: settings
      kinds:
        - {apiVersion: v1, kind: ConfigMap}
        - {apiVersion: v1, kind: Secret}
      template:
        apiVersion: v1
        kind: ${object.data.kind}
        metadata: {name: "${object.metadata.name}-settings"}
        data: {v: "${object.data.kind == 'Secret' ? base64.encode(bytes(object.data.v)) : object.data.v}"}
`

// TestComputedKind: a child's kind comes from its trigger, among the
// kinds its resource lists: made as the kind rendered, repaired, and
// when the trigger picks the other kind the one of the first kind is
// pruned; a kind not listed fails the trigger, saying which it may make,
// and deletes nothing.
//
// API server: discovery of several kinds and their ownerReferences.
func TestComputedKind(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(storeRule))
	h.createCM("t", map[string]string{"store": "yes"}, map[string]string{"kind": "ConfigMap", "v": "one"})
	h.eventually("the settings as a ConfigMap", func() bool {
		cm, ok := h.configMap(h.ns, "t-settings")
		return ok && cm.Data["v"] == "one"
	})

	h.updateCM("t", func(cm *corev1.ConfigMap) { cm.Data["kind"] = "Secret" })
	h.eventually("the settings as a Secret, the ConfigMap pruned", func() bool {
		s, ok := h.secret("t-settings")
		_, cm := h.configMap(h.ns, "t-settings")
		return ok && string(s.Data["v"]) == "one" && !cm
	})
	if err := h.cs.CoreV1().Secrets(h.ns).Delete(t.Context(), "t-settings", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the Secret made again", func() bool { _, ok := h.secret("t-settings"); return ok })

	h.updateCM("t", func(cm *corev1.ConfigMap) { cm.Data["kind"] = "Pod" })
	h.waitForFailed("t", `rendered apiVersion "v1", kind "Pod": not among the kinds the resource may make (v1 ConfigMap, v1 Secret)`)
	if _, ok := h.secret("t-settings"); !ok {
		t.Error("a render that failed pruned the child")
	}
}
