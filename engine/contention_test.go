package engine

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syncloop/syncloop/internal/testenv"
)

// labelNamespaceRule patches the test's Namespace with one label per
// trigger: every trigger writes the same object, as namespace-label's do.
const labelNamespaceRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: contend}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: contend}
  resources:
    - id: namespace
      mode: patch
      template:
        apiVersion: v1
        kind: Namespace
        metadata:
          name: ${object.metadata.namespace}
          labels: {"seen-${object.metadata.name}": "yes"}
  workers: 4
  resyncPeriod: "0"
`

// TestPatchContention: triggers that patch one object at once change it
// under each other: with the object's UID as the never-create
// precondition, not its version, that is no Conflict at all (with the
// version, 40 triggers met 84 and failed 10 times) — no Failed Event,
// every patch lands. An object replaced since the cache read it is a
// Conflict, and the patch goes to the new object on a fresh read.
//
// API server: apply conflicts and UID preconditions under concurrent
// writers.
func TestPatchContention(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(labelNamespaceRule))
	const n = 40
	for i := range n {
		h.createCM(fmt.Sprintf("t%02d", i), map[string]string{"contend": "yes"}, nil)
	}
	h.eventually("every trigger's label on the Namespace", func() bool {
		ns, err := h.cs.CoreV1().Namespaces().Get(t.Context(), h.ns, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for i := range n {
			if ns.Labels[fmt.Sprintf("seen-t%02d", i)] != "yes" {
				return false
			}
		}
		return true
	})
	conflict := func(r testenv.Request) bool { return r.Method == http.MethodPatch && r.Status == http.StatusConflict }
	if c := len(h.counter.Requests(conflict)); c > 0 {
		t.Errorf("%d patches met a Conflict, want none", c)
	}
	if failed := h.events("Failed"); len(failed) > 0 {
		t.Errorf("%d Failed Events, the first on %s: %s", len(failed), failed[0].InvolvedObject.Name, failed[0].Message)
	}

	// Replaced under the cache: the apply names the old UID, is refused,
	// and goes to the new object.
	old := h.createCM("replaced", nil, map[string]string{"k": "old"})
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "replaced", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.createCM("replaced", nil, map[string]string{"k": "new"})
	stale, err := runtime.DefaultUnstructuredConverter.ToUnstructured(old)
	if err != nil {
		t.Fatal(err)
	}
	before := &unstructured.Unstructured{Object: stale}
	before.SetAPIVersion("v1")
	before.SetKind("ConfigMap")
	rc := h.loop("contend").rc
	m, err := h.engine.mapper.Mapping(t.Context(), before.GroupVersionKind())
	if err != nil {
		t.Fatal(err)
	}
	patch := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "replaced", "namespace": h.ns}, "data": map[string]any{"patched": "yes"}}}
	conflicts := len(h.counter.Requests(conflict))
	_, err = rc.applyFresh(t.Context(), &write{kind: writePatch, mapping: m, obj: patch, manager: "syncloop/test", force: true,
		before: before, action: ActionUpdate, ch: &changes{}}, func(*unstructured.Unstructured) bool { return false })
	if err != nil {
		t.Fatalf("applying over a replaced object: %v", err)
	}
	if got, ok := h.configMap(h.ns, "replaced"); !ok || got.Data["patched"] != "yes" || got.Data["k"] != "new" || got.UID == old.UID {
		t.Errorf("the new object is %v, want it patched", got)
	}
	if c := len(h.counter.Requests(conflict)) - conflicts; c != 0 {
		t.Errorf("%d Conflicts, want none: the old UID is refused as Invalid", c)
	}
}

// TestReleaseRetried: the fields of a trigger deleted while syncloop was
// down are released by the start's sweep; a release the API server
// refuses is tried again with backoff until it succeeds — not at the next
// resync or start (a first campaign found eight patch managers left on
// three Namespaces this way).
//
// API server: an admission policy (ValidatingAdmissionPolicy) refusing a
// release, then allowing it.
func TestReleaseRetried(t *testing.T) {
	h := newHarness(t)
	h.createCM("target", nil, nil)
	h.createCM("a", map[string]string{"app": "yes"}, nil)
	seen := func() bool {
		cm, ok := h.configMap(h.ns, "target")
		return ok && cm.Labels["seen-a"] == "yes"
	}
	h.start(h.loadRules(targetOnlyRule))
	h.eventually("patched", seen)
	h.stop()
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	const denial = "the namespace is frozen"
	h.denyInNamespace(denial, "namespaceObject.metadata.?labels.?frozen.orValue('') != 'yes' && !(has(object.data) && 'deny' in object.data)")
	freeze := func(v string) {
		t.Helper()
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"frozen":%q}}}`, v)
		if _, err := h.cs.CoreV1().Namespaces().Patch(t.Context(), h.ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	freeze("yes")
	h.eventually("the freeze enforced", func() bool {
		_, err := h.cs.CoreV1().ConfigMaps(h.ns).Update(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "target", Namespace: h.ns}}, metav1.UpdateOptions{})
		return err != nil && strings.Contains(err.Error(), denial)
	})

	releases := func(r testenv.Request) bool {
		return r.Method == http.MethodPatch && strings.HasSuffix(r.Path, "/configmaps/target")
	}
	before := len(h.counter.Requests(releases))
	h.start(h.loadRules(targetOnlyRule))
	h.eventually("a refused release, and its retry", func() bool { return len(h.counter.Requests(releases)) >= before+2 })
	if !seen() {
		t.Fatal("released while frozen")
	}
	freeze("no")
	h.eventually("released once the API server allows it, without a restart", func() bool { return !seen() })
}
