package render

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/syncloop/syncloop/rules"
)

// customizeRule is a rule whose function has a customize function; both
// are webhooks of url, at /sync and /customize.
func customizeRule(t *testing.T, url string) *rules.Rule {
	return parseRule(t, `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: hello}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  function:
    kinds: [{apiVersion: v1, kind: ConfigMap}]
    webhook: {url: '`+url+`/sync'}
    customize:
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      webhook: {url: '`+url+`/customize'}
`)
}

// customizeHook answers /customize with relatedResources and /sync with
// no children, keeping the sync request it was given.
type customizeHook struct {
	related    string
	customized atomic.Int32
	got        SyncRequest
}

func (h *customizeHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/customize" {
		var in CustomizeRequest
		if err := json.Unmarshal(body, &in); err != nil || in.Parent == nil || in.Controller["kind"] != "CompositeController" {
			http.Error(w, "not a customize request", http.StatusBadRequest)
			return
		}
		h.customized.Add(1)
		_, _ = io.WriteString(w, `{"relatedResources": `+h.related+`}`)
		return
	}
	h.got = SyncRequest{}
	_ = json.Unmarshal(body, &h.got)
	_, _ = io.WriteString(w, `{"children": []}`)
}

// TestCustomizeHook: the customize function names related objects by
// names (in the trigger's namespace unless it says) and by labels; the
// sync request holds them as related; its answer is kept until the
// trigger changes, not when its status does.
func TestCustomizeHook(t *testing.T) {
	h := &customizeHook{related: `[
		{"apiVersion": "v1", "resource": "configmaps", "names": ["a", "missing"]},
		{"apiVersion": "v1", "resource": "configmaps", "namespace": "other", "labelSelector": {"matchLabels": {"team": "x"}}}]`}
	srv := httptest.NewServer(h)
	defer srv.Close()
	r := customizeRule(t, srv.URL)
	trigger := obj("example.com/v1", "App", "ns", "web", nil)
	objs := Objects{obj("v1", "ConfigMap", "ns", "a", nil), obj("v1", "ConfigMap", "ns", "b", nil),
		obj("v1", "ConfigMap", "other", "x1", map[string]any{"team": "x"}), obj("v1", "ConfigMap", "other", "y1", map[string]any{"team": "y"})}
	render := func() []string {
		t.Helper()
		if _, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: objs, Clusters: objs, Applier: &recordingApplier{}}); err != nil {
			t.Fatal(err)
		}
		var names []string
		for name := range h.got.Related["ConfigMap.v1"] {
			names = append(names, name)
		}
		slices.Sort(names)
		return names
	}
	if got := render(); strings.Join(got, ",") != "a,x1" {
		t.Errorf("related %v: want a (by name, the trigger's namespace) and x1 (by labels in other)", got)
	}
	trigger.Object["status"] = map[string]any{"phase": "Ready"}
	trigger.SetResourceVersion("2")
	render()
	if n := h.customized.Load(); n != 1 {
		t.Errorf("customize called %d times for one trigger whose status alone changed, want 1", n)
	}
	trigger.SetLabels(map[string]string{"tier": "gold"})
	render()
	if n := h.customized.Load(); n != 2 {
		t.Errorf("customize called %d times after the trigger's labels changed, want 2", n)
	}
}

// TestCustomizeHookFails: a kind the rule does not list, a namespace for
// a cluster-scoped kind, a bad selector or an unknown field fail the
// trigger naming the customize function; a failed answer is not kept.
func TestCustomizeHookFails(t *testing.T) {
	for related, want := range map[string]string{
		`[{"apiVersion": "v1", "resource": "secrets"}]`:                                                    "returned relatedResources[0] apiVersion v1, resource secrets: not among the kinds listed (v1 ConfigMap)",
		`[{"apiVersion": "v1", "resource": "configmaps", "labelSelector": {"matchLabels": {"a b": "c"}}}]`: "returned relatedResources[0]: labelSelector:",
		`[{"apiVersion": "v1", "resource": "configmaps", "name": "a"}]`:                                    `unknown field "name"`,
		`[{"resource": "configmaps"}]`:                                                                     "relatedResources[0] needs apiVersion and resource",
	} {
		h := &customizeHook{related: related}
		srv := httptest.NewServer(h)
		r := customizeRule(t, srv.URL)
		for range 2 {
			_, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "ns", "web", nil), Scoper: testScopes, Lookups: Objects{}, Applier: &recordingApplier{}})
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "customize webhook "+srv.URL) {
				t.Errorf("%s: got %v, want %q naming the customize webhook", related, err, want)
			}
		}
		if n := h.customized.Load(); n != 2 {
			t.Errorf("%s: customize called %d times for two renders, want 2: a failed answer is not kept", related, n)
		}
		srv.Close()
	}
}

// TestCustomizeHookOffline: offline, a test's recorded response for
// resource sync/customize answers for the customize webhook.
func TestCustomizeHookOffline(t *testing.T) {
	r := customizeRule(t, "http://127.0.0.1:1")
	trigger := obj("example.com/v1", "App", "ns", "web", nil)
	ref := rules.ObjectRef{Kind: "App", Name: "web"}
	rec := Recorded{Objects: Objects{obj("v1", "ConfigMap", "ns", "a", nil)}, Responses: []RecordedResponse{
		{Rule: "hello", Resource: rules.SyncResourceID + "/customize", Trigger: ref, Response: []byte(`{"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "names": ["a"]}]}`)},
	}}
	_, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: rec, Clusters: rec, Recorded: rec})
	if err == nil || !strings.Contains(err.Error(), "webhook http://127.0.0.1:1/sync") || !strings.Contains(err.Error(), "offline") {
		t.Fatalf("got %v, want the customize answered and the sync webhook failing offline", err)
	}
	rec.Responses = rec.Responses[:0]
	_, err = Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: rec, Clusters: rec, Recorded: rec})
	if err == nil || !strings.Contains(err.Error(), "customize webhook http://127.0.0.1:1/customize") {
		t.Fatalf("got %v, want the customize webhook failing offline", err)
	}
}
