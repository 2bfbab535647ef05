package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules/render"
)

// wavesRule gives each Widget labelled waves three ConfigMaps, each
// reading the one before: top reads mid, mid reads base. Torn down in
// order, top goes first, base last. TEARDOWN is the rule's teardown.
const wavesRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: waves}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS, labelSelector: waves}
  teardown: TEARDOWN
  resources:
    - id: base
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-base"}
        data: {v: "1"}
    - id: mid
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-mid"}
        data: {base: "${children.base.metadata.name}"}
    - id: top
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-top"}
        data: {mid: "${children.mid.metadata.name}"}
  status:
    top: "${children.top.metadata.name}"
`

// testHold is a finalizer the tests put on a child to keep it, being
// deleted, until they let it go.
const testHold = "test.syncloop.dev/hold"

// TestOrderedTeardown: a Widget whose three children read each other in
// a chain is held by the rule's finalizer; deleted, its children go in
// three waves, dependents first, each only once the wave before is gone —
// across a restart of syncloop mid-teardown — and its status and Events
// say which wave it waits on. The finalizer goes last, and the Widget
// with it.
//
// API server: finalizers on a CRD's objects and foreground deletion, wave
// by wave.
func TestOrderedTeardown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane of its own")
	}
	// A control plane of its own: a child deleted in the foreground goes
	// once the garbage collector has seen it has no dependents, and the
	// package's shared one, where other tests come and go with their
	// CRDs, may hold its garbage collector back for minutes (it waits for
	// every kind's informer to sync after a CRD change).
	env, err := testenv.Start(t.Context(), testenv.Options{ControllerManager: true, Controllers: []string{"garbagecollector"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	h := newHarnessOn(t, env)
	h.installWidgets()
	set := h.loadRules(strings.ReplaceAll(wavesRule, "TEARDOWN", "Ordered"))
	finalizer := set.Get("waves").TeardownFinalizer()
	h.start(set)
	h.createLabelledWidget("w", "waves")
	h.eventually("the children and the finalizer", func() bool {
		_, top := h.configMap(h.ns, "w-top")
		return top && slices.Contains(h.widget("w").GetFinalizers(), finalizer)
	})
	h.holdChild("w-top")
	h.holdChild("w-mid")
	if err := h.dynamic().Resource(widgets).Namespace(h.ns).Delete(t.Context(), "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	h.waitForWave("w", 1, "w-top")
	h.waitForEventWithin(30*time.Second, render.ReasonTearingDown, "w", "deleting wave 1 of 3: ConfigMap "+h.ns+"/w-top")
	h.checkNotDeleting("w-mid", "w-base")

	h.stop()
	h.start(set)
	h.letGoChild("w-top")
	h.waitForWave("w", 2, "w-mid")
	h.checkNotDeleting("w-base")

	h.letGoChild("w-mid")
	h.eventually("the widget and its last child gone", func() bool {
		_, base := h.configMap(h.ns, "w-base")
		_, err := h.dynamic().Resource(widgets).Namespace(h.ns).Get(t.Context(), "w", metav1.GetOptions{})
		return !base && apierrors.IsNotFound(err)
	})
}

// TestTeardownFinalizerLetGo: the rule's finalizer never outlives its
// reason: it comes off a trigger that leaves the rule's selector, the
// triggers of a rule that stops ordering its teardown, and those of a rule
// removed from the set; a rule whose resources read no other holds none.
//
// API server: finalizers taken off with JSON patches and their test
// preconditions.
func TestTeardownFinalizerLetGo(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	ordered := h.loadRules(strings.ReplaceAll(wavesRule, "TEARDOWN", "Ordered"))
	finalizer := ordered.Get("waves").TeardownFinalizer()
	held := func(name string) bool { return slices.Contains(h.widget(name).GetFinalizers(), finalizer) }
	h.start(ordered)
	for _, name := range []string{"leaves", "stays"} {
		h.createLabelledWidget(name, "waves")
		h.eventually(name+" held", func() bool { return held(name) })
	}

	w := h.widget("leaves")
	w.SetLabels(nil)
	if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Update(t.Context(), w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the finalizer off the widget that left the selector", func() bool { return !held("leaves") })

	h.updates <- h.loadRules(strings.ReplaceAll(wavesRule, "TEARDOWN", "Unordered"))
	h.eventually("the finalizer off once the rule no longer orders", func() bool { return !held("stays") })
	if _, ok := h.configMap(h.ns, "stays-top"); !ok {
		t.Fatalf("the children went with the finalizer")
	}

	h.updates <- ordered
	h.eventually("held again", func() bool { return held("stays") })
	other := h.loadRules(strings.ReplaceAll(strings.ReplaceAll(wavesRule, "TEARDOWN", "Ordered"), "name: waves", "name: other"))
	h.updates <- other
	h.eventually("the finalizer off once the rule is removed", func() bool { return !held("stays") })
	h.eventually("the other rule holding it", func() bool {
		return slices.Contains(h.widget("stays").GetFinalizers(), other.Get("other").TeardownFinalizer())
	})

	flat := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: flat}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS, labelSelector: flat}
  teardown: Ordered
  resources:
    - id: one
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-one"}}
`
	h.updates <- h.loadRules(flat)
	h.createLabelledWidget("flat", "flat")
	h.eventually("the flat rule's child", func() bool { _, ok := h.configMap(h.ns, "flat-one"); return ok })
	if f := h.widget("flat").GetFinalizers(); len(f) > 0 {
		t.Errorf("a rule with nothing to order put finalizers %v on its trigger", f)
	}
}

// createLabelledWidget creates a Widget labelled label=yes.
func (h *harness) createLabelledWidget(name, label string) {
	h.t.Helper()
	w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "test.syncloop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "labels": map[string]any{label: "yes"}}}}
	if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Create(h.t.Context(), w, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// holdChild puts testHold on a ConfigMap; letGoChild takes it off.
func (h *harness) holdChild(name string) {
	h.t.Helper()
	h.updateCM(name, func(cm *corev1.ConfigMap) { cm.Finalizers = append(cm.Finalizers, testHold) })
}

func (h *harness) letGoChild(name string) {
	h.t.Helper()
	h.updateCM(name, func(cm *corev1.ConfigMap) {
		cm.Finalizers = slices.DeleteFunc(cm.Finalizers, func(f string) bool { return f == testHold })
	})
}

// waitForWave waits until the Widget's Ready condition says its teardown
// deletes wave (1-based), and the child named is being deleted. A wave
// follows the one before once the garbage collector has let the children
// deleted in the foreground go.
func (h *harness) waitForWave(name string, wave int, child string) {
	h.t.Helper()
	want := "deleting wave " + string(rune('0'+wave)) + " of 3: ConfigMap " + h.ns + "/" + child
	if !h.within(30*time.Second, func() bool {
		cond := readyCondition(h.widget(name))
		cm, ok := h.configMap(h.ns, child)
		return cond != nil && cond["reason"] == render.ReasonTearingDown && cond["message"] == want &&
			ok && cm.DeletionTimestamp != nil
	}) {
		var state []string
		for _, n := range []string{"w-top", "w-mid", "w-base"} {
			if cm, ok := h.configMap(h.ns, n); ok {
				state = append(state, fmt.Sprintf("%s deleting=%v finalizers=%v", n, cm.DeletionTimestamp != nil, cm.Finalizers))
			}
		}
		h.t.Fatalf("timed out waiting for %s; the Widget's Ready condition %v; children: %s", want, readyCondition(h.widget(name)), strings.Join(state, "; "))
	}
}

// checkNotDeleting fails the test if a child named is gone or being
// deleted.
func (h *harness) checkNotDeleting(names ...string) {
	h.t.Helper()
	for _, name := range names {
		cm, ok := h.configMap(h.ns, name)
		if !ok || cm.DeletionTimestamp != nil {
			h.t.Errorf("%s is gone or being deleted before the wave that reads it is gone", name)
		}
	}
}

// TestMarksNeverCreate: what syncloop applies to a trigger's metadata (its
// createOnce memory, its teardown finalizer) carries the trigger's UID, so
// that a trigger deleted since the cache read it is not created again by
// the apply — which, without the UID, would make an empty ConfigMap of its
// name.
//
// API server: server-side apply to a trigger's metadata with a UID
// precondition.
func TestMarksNeverCreate(t *testing.T) {
	h := newHarness(t)
	cm := h.createCM("gone", nil, nil)
	trigger := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": cm.Name, "namespace": cm.Namespace, "uid": string(cm.UID)}}}
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	patch := markOf(trigger)
	patch.SetFinalizers([]string{"teardown.syncloop.dev/r"})
	cms := h.dynamic().Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(h.ns)
	if _, err := cms.Apply(t.Context(), "gone", patch, metav1.ApplyOptions{FieldManager: "syncloop/r/teardown", Force: true}); !apierrors.IsConflict(err) {
		t.Errorf("applying a mark to a trigger gone: %v, want a Conflict", err)
	}
	if _, ok := h.configMap(h.ns, "gone"); ok {
		t.Fatal("the apply of a mark created the trigger again")
	}
}
