package engine

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// graphRule: addr reads the Service's allocated clusterIP; app reads gate,
// which is ready once someone else writes data.open=yes into it.
const graphRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: graph}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  when: "object.?spec.?off.orValue(false) != true"
  resyncPeriod: "0"
  resources:
    - id: svc
      template:
        apiVersion: v1
        kind: Service
        metadata: {name: "${object.metadata.name}"}
        spec: {ports: [{port: 80}]}
    - id: addr
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-addr"}
        data: {address: "${children.svc.spec.clusterIP}:80"}
    - id: gate
      readyWhen: ["self.?data.?open.orValue('') == 'yes'"]
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-gate"}
        data: {made: "yes"}
    - id: app
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-app"}
        data: {gate: "${children.gate.metadata.name}"}
  status:
    address: "${children.?addr.?data.?address.orValue('')}"
    gateReady: ${ready.gate}
`

// installWidgets installs the Widget kind (a status subresource, any
// fields) on the test's control plane.
func (h *harness) installWidgets() {
	h.t.Helper()
	if _, err := h.env.InstallCRDs(h.t.Context(), filepath.Join("testdata", "widgets-crd.yaml")); err != nil {
		h.t.Fatal(err)
	}
}

// createWidget creates a Widget in the test's namespace.
func (h *harness) createWidget(name string, spec map[string]any) {
	h.t.Helper()
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.syncloop.dev/v1", "kind": "Widget", "metadata": map[string]any{"name": name}}}
	if spec != nil {
		w.Object["spec"] = spec
	}
	if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Create(h.t.Context(), w, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// widget reads a Widget of the test's namespace from the API server.
func (h *harness) widget(name string) *unstructured.Unstructured {
	h.t.Helper()
	w, err := h.dynamic().Resource(widgets).Namespace(h.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return w
}

// readyCondition returns the trigger's Ready condition, or nil.
func readyCondition(obj *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == render.ConditionReady {
			return m
		}
	}
	return nil
}

// TestGraph: references, waiting on readyWhen, the Ready condition,
// zero writes at steady state, reverse-order pruning.
//
// API server: readiness read from live children, status subresource,
// ordered deletes.
func TestGraph(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	m := &recordingMetrics{}
	h.metrics = m
	h.start(h.loadRules(graphRule))
	wc := h.dynamic().Resource(widgets).Namespace(h.ns)
	h.createWidget("w", map[string]any{"size": int64(1)})
	widget := func() *unstructured.Unstructured { return h.widget("w") }

	// The ConfigMap receives the Service's allocated address.
	h.eventually("the address ConfigMap", func() bool { _, ok := h.configMap(h.ns, "w-addr"); return ok })
	svc, err := h.cs.CoreV1().Services(h.ns).Get(t.Context(), "w", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP == "" {
		t.Fatalf("service %v, %v: want an allocated clusterIP", svc, err)
	}
	addr, _ := h.configMap(h.ns, "w-addr")
	if got := addr.Data["address"]; got != svc.Spec.ClusterIP+":80" {
		t.Errorf("address %q, want the Service's %s:80", got, svc.Spec.ClusterIP)
	}

	// app waits for gate; the condition says so, for this generation.
	h.eventually("Ready False, WaitingForGate", func() bool {
		c := readyCondition(widget())
		return c != nil && c["status"] == "False" && c["reason"] == "WaitingForGate"
	})
	w := widget()
	c := readyCondition(w)
	if c["observedGeneration"] != w.GetGeneration() || c["lastTransitionTime"] == "" {
		t.Errorf("condition %v: want observedGeneration %d and a lastTransitionTime", c, w.GetGeneration())
	}
	if st, _, _ := unstructured.NestedMap(w.Object, "status"); st["gateReady"] != false || st["address"] != svc.Spec.ClusterIP+":80" {
		t.Errorf("status %v", st)
	}
	ctl := h.loop("graph")
	h.eventually("the rule idle", ctl.idle)
	if _, ok := h.configMap(h.ns, "w-app"); ok {
		t.Fatal("app was applied before gate was ready")
	}
	if m.written("graph", "wait") == 0 {
		t.Error(`no syncloop_apply_total{action="wait"} counted for the waiting app`)
	}

	// Someone else opens the gate: app follows — the gate's event queues
	// the trigger; there is no periodic resync — and the condition turns
	// True.
	if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Patch(t.Context(), "w-gate", types.MergePatchType,
		[]byte(`{"data":{"open":"yes"}}`), metav1.PatchOptions{FieldManager: "test"}); err != nil {
		t.Fatal(err)
	}
	h.eventually("app, and Ready True", func() bool {
		_, app := h.configMap(h.ns, "w-app")
		c := readyCondition(widget())
		return app && c != nil && c["status"] == "True" && c["reason"] == render.ReasonAllResourcesReady
	})
	if st, _, _ := unstructured.NestedMap(widget().Object, "status"); st["gateReady"] != true {
		t.Errorf("status %v: want gateReady true", st)
	}

	// kubectl wait --for=condition=Ready, as kubectl checks it: a watch
	// until the condition is True for the object's current generation.
	if _, err := wc.Patch(t.Context(), "w", types.MergePatchType, []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h, "w")

	// Steady state: no writes, the condition included, over resyncs (run
	// by hand: the rule's periodic resync is off, so that everything above
	// was driven by events alone).
	quiet := func() {
		k0 := ctl.reconciles.Load()
		ctl.resync(t.Context())
		h.eventually("a resync processed", func() bool { return ctl.reconciles.Load() > k0 && ctl.idle() })
	}
	h.eventually("a resync without writes", func() bool {
		h.counter.Reset()
		quiet()
		return len(h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() })) == 0
	})
	h.counter.Reset()
	for range 3 {
		quiet()
	}
	if writes := h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }); len(writes) != 0 {
		t.Errorf("steady state: %d writes, want none: %v", len(writes), writes)
	}

	// Pruning goes dependents first: app before gate.
	watcher, err := h.cs.CoreV1().ConfigMaps(h.ns).Watch(t.Context(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=graph"})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()
	if _, err := wc.Patch(t.Context(), "w", types.MergePatchType, []byte(`{"spec":{"off":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var deleted []string
	deadline := time.After(time.Minute)
	for len(deleted) < 3 {
		select {
		case ev := <-watcher.ResultChan():
			if ev.Type == watch.Deleted {
				deleted = append(deleted, ev.Object.(*corev1.ConfigMap).Name)
			}
		case <-deadline:
			t.Fatalf("deleted %v within a minute, want three ConfigMaps", deleted)
		}
	}
	if slices.Index(deleted, "w-app") > slices.Index(deleted, "w-gate") || slices.Index(deleted, "w-gate") > slices.Index(deleted, "w-addr") {
		t.Errorf("deleted in order %v, want w-app, w-gate, w-addr (reverse dependency order)", deleted)
	}
}

// waitReady is `kubectl wait --for=condition=Ready`: it watches the Widget
// until its Ready condition is True and observes its current generation.
func waitReady(t *testing.T, h *harness, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	wc := h.dynamic().Resource(widgets).Namespace(h.ns)
	w, err := wc.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		obj, ok := ev.Object.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		c := readyCondition(obj)
		if c != nil && c["status"] == "True" && c["observedGeneration"] == obj.GetGeneration() {
			return
		}
	}
	t.Fatalf("%s: condition Ready not True for its generation within a minute", name)
}

// TestDeletionPolicyPerResource: a resource with deletionPolicy Orphan
// keeps its child when the trigger is deleted; the child carries no
// ownerReference, so the garbage collector leaves it too. The other child
// goes.
//
// API server: the garbage collector's ownerReferences, present or absent
// per resource.
func TestDeletionPolicyPerResource(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mixed}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: mixed}
  resources:
    - id: kept
      deletionPolicy: Orphan
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-kept"}}
    - id: gone
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-gone"}}
`))
	h.createCM("t", map[string]string{"mixed": "yes"}, nil)
	h.eventually("both children", func() bool {
		_, a := h.configMap(h.ns, "t-kept")
		_, b := h.configMap(h.ns, "t-gone")
		return a && b
	})
	kept, _ := h.configMap(h.ns, "t-kept")
	gone, _ := h.configMap(h.ns, "t-gone")
	if len(kept.OwnerReferences) != 0 || len(gone.OwnerReferences) != 1 {
		t.Fatalf("ownerReferences: kept %v, gone %v; want none and one", kept.OwnerReferences, gone.OwnerReferences)
	}
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "t", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c := h.loop("mixed")
	h.eventually("the Delete child gone and the rule idle", func() bool {
		_, ok := h.configMap(h.ns, "t-gone")
		return !ok && c.idle()
	})
	if _, ok := h.configMap(h.ns, "t-kept"); !ok {
		t.Error("the Orphan child was deleted with its trigger")
	}
}

// TestGraphDryRun: a dry run plans the resources it can apply and shows
// the dependent that would wait, with why.
//
// API server: server-side dry-run requests (dryRun=All) with defaulting.
func TestGraphDryRun(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	planner := &recordingPlanner{}
	h.plan = planner
	h.createWidget("d", nil)
	h.start(h.loadRules(graphRule))
	h.eventually("creates for svc, addr and gate, and app waiting", func() bool {
		return planner.count(ActionCreate) >= 3 && planner.count(ActionWait) >= 1
	})
	planner.mu.Lock()
	defer planner.mu.Unlock()
	for _, a := range planner.actions {
		switch a.Action {
		case ActionWait:
			if a.Resource != "app" || a.Object.Kind != "ConfigMap" || !strings.Contains(a.Reason, `waiting for resource "gate"`) {
				t.Errorf("wait %+v", a)
			}
		case ActionCreate:
			if a.Object.Name == "d-app" {
				t.Errorf("planned to create app, which waits for gate")
			}
		}
	}
	if _, ok := h.configMap(h.ns, "d-gate"); ok {
		t.Error("a dry run created a child")
	}
}

// TestReadyConditionReconcileFailed: a reconcile that fails says so in the
// Ready condition, and the rule's status fields keep their values.
//
// API server: the status subresource, written after a refused apply.
func TestReadyConditionReconcileFailed(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: failing}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-cm"}
        data: {name: "${object.spec.name}"}
  status:
    size: ${object.spec.size}
`))
	wc := h.dynamic().Resource(widgets).Namespace(h.ns)
	h.createWidget("f", map[string]any{"size": int64(1), "name": "x"})
	get := func() *unstructured.Unstructured { return h.widget("f") }
	h.eventually("Ready True", func() bool {
		c := readyCondition(get())
		return c != nil && c["status"] == "True" && c["message"] == "the resource is ready"
	})
	if _, err := wc.Patch(t.Context(), "f", types.MergePatchType, []byte(`{"spec":{"size":2,"name":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("Ready False, ReconcileFailed", func() bool {
		c := readyCondition(get())
		return c != nil && c["status"] == "False" && c["reason"] == render.ReasonReconcileFailed
	})
	w := get()
	c := readyCondition(w)
	if !strings.Contains(c["message"].(string), "no such key: name") || c["observedGeneration"] != w.GetGeneration() {
		t.Errorf("condition %v: want the error and generation %d", c, w.GetGeneration())
	}
	if size, _, _ := unstructured.NestedInt64(w.Object, "status", "size"); size != 1 {
		t.Errorf("status.size %d: a failed reconcile must keep the rule's status fields (1)", size)
	}
}
