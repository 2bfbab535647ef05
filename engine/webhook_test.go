package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/rules"
)

// syncHook is a hook server written to Metacontroller's sync hook
// protocol alone: a Widget's spec.replicas ConfigMaps with its greeting,
// and as status the ConfigMaps it was shown. Widgets named broken get a
// 500, sneaky a Secret, ticker a resync every half second.
type syncHook struct {
	mu    sync.Mutex
	calls map[string]int // by parent name
	// finalizing counts the finalize calls by parent name; done says
	// whether the finalize hook answers finalized.
	finalizing map[string]int
	done       bool
}

func (s *syncHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Parent   map[string]any                       `json:"parent"`
		Children map[string]map[string]map[string]any `json:"children"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	parent := &unstructured.Unstructured{Object: req.Parent}
	if r.URL.Path == "/finalize" {
		// Metacontroller's finalize hook: no children, a status saying
		// so, finalized once the test lets it.
		s.mu.Lock()
		s.finalizing[parent.GetName()]++
		done := s.done
		s.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"status": map[string]any{"phase": "Finalizing"}, "children": []any{}, "finalized": done})
		return
	}
	s.mu.Lock()
	s.calls[parent.GetName()]++
	s.mu.Unlock()
	n, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "spec", "replicas")
	replicas, _ := n.(float64) // JSON, as a hook server reads it
	greeting, _, _ := unstructured.NestedString(parent.Object, "spec", "greeting")
	resp := map[string]any{"status": map[string]any{"configMaps": len(req.Children["ConfigMap.v1"]), "greeting": greeting}}
	var children []any
	for i := range int(replicas) {
		children = append(children, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", parent.GetName(), i)}, "data": map[string]any{"greeting": greeting}})
	}
	switch parent.GetName() {
	case "broken":
		http.Error(w, "the hook broke", http.StatusInternalServerError)
		return
	case "sneaky":
		children = append(children, map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "sneaky"}})
	case "ticker":
		resp["resyncAfterSeconds"] = 0.5
	}
	resp["children"] = children
	_ = json.NewEncoder(w).Encode(resp)
}

func (s *syncHook) callsOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

func (s *syncHook) finalizingOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalizing[name]
}

// TestSyncWebhook: a rule whose function is a webhook speaking
// Metacontroller's sync hook protocol serves Widgets against the real API
// server: the children it returns are created, updated and pruned as
// syncloop's own, the status it returns is written with the children it
// was shown, a failing hook and a kind it may not return fail only their
// triggers (retried), resyncAfterSeconds calls it again, the finalize
// hook holds a deleted trigger until it answers finalized, and the calls
// are counted.
func TestSyncWebhook(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	hook := &syncHook{calls: map[string]int{}, finalizing: map[string]int{}}
	srv := httptest.NewServer(hook)
	defer srv.Close()
	m := &recordingMetrics{}
	h.metrics = m
	set := h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: hello}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  function:
    kinds: [{apiVersion: v1, kind: ConfigMap}]
    webhook: {url: '` + srv.URL + `/sync'}
    finalize:
      webhook: {url: '` + srv.URL + `/finalize'}
`)
	for _, name := range []string{"web", "broken", "sneaky", "ticker"} {
		h.createWidget(name, map[string]any{"replicas": int64(2), "greeting": "hello"})
	}
	h.start(set)

	greeting := func(name string) string {
		cm, ok := h.configMap(h.ns, name)
		if !ok || cm.Labels[rules.LabelRule] != "hello" {
			return ""
		}
		return cm.Data["greeting"]
	}
	h.eventually("web's two ConfigMaps", func() bool { return greeting("web-0") == "hello" && greeting("web-1") == "hello" })
	h.eventually("web's status: the two ConfigMaps it was shown", func() bool {
		w := h.widget("web")
		n, _, _ := unstructured.NestedInt64(w.Object, "status", "configMaps")
		cond := readyCondition(w)
		return n == 2 && cond != nil && cond["status"] == "True"
	})
	h.waitForFailed("broken", "webhook "+srv.URL+"/sync: answered 500 Internal Server Error (stderr: the hook broke)")
	h.waitForFailed("sneaky", `returned apiVersion "v1", kind "Secret": not among the kinds listed (v1 ConfigMap)`)
	if _, ok := h.configMap(h.ns, "sneaky-0"); ok {
		t.Error("sneaky's ConfigMaps were applied: a child of a kind not listed must fail the whole trigger first")
	}
	h.eventually("broken retried with backoff", func() bool { return hook.callsOf("broken") >= 3 })
	before := hook.callsOf("ticker")
	h.eventually("ticker called again, unchanged, as it asked", func() bool { return hook.callsOf("ticker") >= before+3 })

	// An update reaches the hook; what it no longer returns is pruned.
	patch := []byte(`{"spec": {"replicas": 1, "greeting": "bonjour"}}`)
	if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Patch(t.Context(), "web", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("web-0 updated, web-1 pruned", func() bool {
		_, stays := h.configMap(h.ns, "web-1")
		return greeting("web-0") == "bonjour" && !stays
	})
	h.eventually("web's status follows", func() bool {
		w := h.widget("web")
		n, _, _ := unstructured.NestedInt64(w.Object, "status", "configMaps")
		g, _, _ := unstructured.NestedString(w.Object, "status", "greeting")
		return n == 1 && g == "bonjour"
	})
	// Deleted, web is held by the rule's finalizer for the finalize hook:
	// its children go as the hook answers, its status says what the
	// hook does, and it goes once the hook answers finalized.
	if f := h.widget("web").GetFinalizers(); len(f) != 1 || f[0] != "teardown.syncloop.dev/hello" {
		t.Fatalf("web's finalizers %v: want the rule's, for its finalize hook", f)
	}
	if err := h.dynamic().Resource(widgets).Namespace(h.ns).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("web finalizing: its ConfigMap pruned as the hook answers, its status the hook's", func() bool {
		_, stays := h.configMap(h.ns, "web-0")
		w := h.widget("web")
		phase, _, _ := unstructured.NestedString(w.Object, "status", "phase")
		return !stays && phase == "Finalizing" && w.GetDeletionTimestamp() != nil && hook.finalizingOf("web") >= 2
	})
	if n := hook.callsOf("web"); n == 0 {
		t.Fatal("no sync calls for web")
	}
	syncs := hook.callsOf("web")
	hook.mu.Lock()
	hook.done = true
	hook.mu.Unlock()
	h.eventually("web gone once finalized", func() bool {
		_, err := h.dynamic().Resource(widgets).Namespace(h.ns).Get(t.Context(), "web", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if n := hook.callsOf("web"); n != syncs {
		t.Errorf("the sync hook was called %d times for web while it was finalized: the finalize hook answers instead", n-syncs)
	}
	m.mu.Lock()
	ok, failed := m.calls["hello sync webhook success"], m.calls["hello sync webhook error"]
	finalized := m.calls["hello sync/finalize webhook success"]
	m.mu.Unlock()
	if ok < 3 || failed < 3 || finalized < 2 {
		t.Errorf("calls counted: %d succeeded, %d failed, %d finalize; want each at least 3 (finalize 2)", ok, failed, finalized)
	}
}
