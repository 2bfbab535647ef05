package engine

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// customizeHook is a hook server written to Metacontroller's customize
// and sync hook protocols alone: a Widget relates its <name>-config
// ConfigMap by name and those labelled widget=<name>; its one child,
// <name>-out, says which it was given and the color of <name>-config.
// The Widget named stray relates Secrets, which its rule does not list.
type customizeHook struct {
	mu         sync.Mutex
	customized map[string]int // by parent name
}

func (s *customizeHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Parent  map[string]any                       `json:"parent"`
		Related map[string]map[string]map[string]any `json:"related"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name := (&unstructured.Unstructured{Object: req.Parent}).GetName()
	if r.URL.Path == "/customize" {
		s.mu.Lock()
		s.customized[name]++
		s.mu.Unlock()
		resource := "configmaps"
		if name == "stray" {
			resource = "secrets"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"relatedResources": []any{
			map[string]any{"apiVersion": "v1", "resource": resource, "names": []string{name + "-config"}},
			map[string]any{"apiVersion": "v1", "resource": resource, "labelSelector": map[string]any{"matchLabels": map[string]any{"widget": name}}},
		}})
		return
	}
	var names []string
	for n := range req.Related["ConfigMap.v1"] {
		names = append(names, n)
	}
	slices.Sort(names)
	color, _, _ := unstructured.NestedString(req.Related["ConfigMap.v1"][name+"-config"], "data", "color")
	_ = json.NewEncoder(w).Encode(map[string]any{"children": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name + "-out"}, "data": map[string]any{"related": strings.Join(names, ","), "color": color}}}})
}

func (s *customizeHook) customizedOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.customized[name]
}

// TestCustomizeWebhook: a rule function's customize hook, against the
// real API server, relates objects by name and by labels; the sync hook
// is given them from the caches, and called again when they change or
// appear — while the customize hook, whose answer depends on the trigger
// alone, is not; a kind the rule does not list fails only its trigger.
func TestCustomizeWebhook(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	hook := &customizeHook{customized: map[string]int{}}
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
    customize:
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      webhook: {url: '` + srv.URL + `/customize'}
`)
	configMap := func(name, color string, labels map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string]string{"color": color}}
	}
	if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(t.Context(), configMap("web-config", "blue", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.createWidget("web", map[string]any{"greeting": "hello"})
	h.createWidget("stray", map[string]any{"greeting": "hello"})
	h.start(set)

	out := func() (related, color string) {
		cm, ok := h.configMap(h.ns, "web-out")
		if !ok {
			return "", ""
		}
		return cm.Data["related"], cm.Data["color"]
	}
	h.eventually("web-out from web-config", func() bool { r, c := out(); return r == "web-config" && c == "blue" })
	h.waitForFailed("stray", "customize webhook "+srv.URL+"/customize returned relatedResources[0] apiVersion v1, resource secrets: not among the kinds listed (v1 ConfigMap)")

	// A related object changes: the sync hook is called again with it.
	if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Update(t.Context(), configMap("web-config", "red", nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("web-out follows web-config", func() bool { _, c := out(); return c == "red" })
	// One appears that the labels select.
	if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(t.Context(), configMap("extra", "green", map[string]string{"widget": "web"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("web-out relates extra too", func() bool { r, _ := out(); return r == "extra,web-config" })
	if n := hook.customizedOf("web"); n != 1 {
		t.Errorf("the customize hook was called %d times for web, unchanged: want 1, its answer kept", n)
	}
	m.mu.Lock()
	customized := m.calls["hello sync/customize webhook success"]
	m.mu.Unlock()
	if customized < 1 {
		t.Errorf("customize calls counted: %d, want at least 1", customized)
	}
}
