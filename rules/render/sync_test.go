package render

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
)

// syncRule is a rule whose function is a webhook at url, with a lookup
// (related) and a status template beside the function's status.
func syncRule(t *testing.T, url string) *rules.Rule {
	return parseRule(t, `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: hello}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  lookups:
    - {id: defaults, apiVersion: v1, kind: ConfigMap, name: defaults}
  function:
    kinds: [{apiVersion: v1, kind: ConfigMap}]
    webhook: {url: '`+url+`'}
  status:
    configMaps: "${size(children.sync)}"
`)
}

// observed is a Lookuper and a ChildLister: objects, and children in the
// cluster.
type observed struct {
	Objects
	children []*unstructured.Unstructured
}

func (o observed) Children(context.Context) []*unstructured.Unstructured { return o.children }

// recordingApplier applies nothing and notes the calls it is told of.
type recordingApplier struct {
	mu    sync.Mutex
	calls []string
}

func (a *recordingApplier) Apply(_ context.Context, c Child) (map[string]any, error) {
	return c.Object.Object, nil
}

func (*recordingApplier) Observed(Child) map[string]any { return nil }

func (a *recordingApplier) FunctionCalled(res *rules.Resource, fn *rules.Function, _ time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, res.ID+" "+fn.Transport()+" "+map[bool]string{true: "error", false: "success"}[err != nil])
}

// TestSyncHook renders a rule whose function is a Metacontroller sync
// hook: the hook is given the parent, its children by kind and what the
// lookups read as related; its children are the rule's, marked as
// syncloop's; its status is the trigger's, under the template's fields.
func TestSyncHook(t *testing.T) {
	var got SyncRequest
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &got); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		name := got.Parent["metadata"].(map[string]any)["name"].(string)
		_, _ = io.WriteString(w, `{"status": {"replicas": 2, "configMaps": "hook's"}, "resyncAfterSeconds": 1.5,
			"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "`+name+`-a"}, "data": {"x": "1"}},
			             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "`+name+`-b"}}]}`)
	}))
	defer hook.Close()
	r := syncRule(t, hook.URL)
	trigger := obj("example.com/v1", "App", "ns", "web", nil)
	defaults := obj("v1", "ConfigMap", "ns", "defaults", nil)
	old := obj("v1", "ConfigMap", "ns", "web-old", nil)
	ap := &recordingApplier{}
	cluster := observed{Objects{defaults}, []*unstructured.Unstructured{old}}
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: cluster, Clusters: cluster, Children: cluster, Applier: ap, Calls: ap})
	if err != nil {
		t.Fatal(err)
	}
	if got.Controller["kind"] != "CompositeController" || got.Rule != "hello" || got.Finalizing {
		t.Errorf("request controller %v, rule %q", got.Controller, got.Rule)
	}
	if _, ok := got.Children["ConfigMap.v1"]["web-old"]; !ok {
		t.Errorf("request children %v: want web-old under ConfigMap.v1", got.Children)
	}
	if _, ok := got.Related["ConfigMap.v1"]["defaults"]; !ok {
		t.Errorf("request related %v: want the lookup's defaults under ConfigMap.v1", got.Related)
	}
	if len(rd.Children) != 2 || rd.Children[0].Object.GetName() != "web-a" || rd.Children[0].ResourceID != rules.SyncResourceID {
		t.Fatalf("children %v: want web-a and web-b of resource sync", rd.Children)
	}
	if c := rd.Children[0].Object; c.GetNamespace() != "ns" || c.GetLabels()[rules.LabelOwnerUID] != "uid-web" {
		t.Errorf("child %v: want the trigger's namespace and syncloop's marks", c.Object)
	}
	if rd.ResyncAfter != 1500*time.Millisecond {
		t.Errorf("resync after %s, want 1.5s", rd.ResyncAfter)
	}
	status, err := rd.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if status["replicas"] != int64(2) || status["configMaps"] != int64(2) {
		t.Errorf("status %v: want the hook's replicas, and configMaps from the template over the hook's", status)
	}
	if strings.Join(ap.calls, ",") != "sync webhook success" {
		t.Errorf("calls observed %v", ap.calls)
	}
}

// TestSyncHookFails: a hook that fails, or answers what is not a sync
// response, fails the render with the hook named — before any child is
// applied, so nothing is pruned for it.
func TestSyncHookFails(t *testing.T) {
	for body, want := range map[string]string{
		`{"childern": []}`:                   `unknown field "childern"`,
		`{"children": {}}`:                   "children is a mapping, not a list",
		`{"status": []}`:                     "status is a list, not an object",
		`{"resyncAfterSeconds": -1}`:         "resyncAfterSeconds is -1, not a number of seconds from 0 to a day",
		`{"children": [{"kind": "Secret"}]}`: "returned apiVersion null, kind \"Secret\": not among the kinds listed (v1 ConfigMap)",
		`500`:                                "answered 500 Internal Server Error",
	} {
		hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if body == "500" {
				http.Error(w, "boom", http.StatusInternalServerError)
				return
			}
			_, _ = io.WriteString(w, body)
		}))
		r := syncRule(t, hook.URL)
		ap := &recordingApplier{}
		_, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "ns", "web", nil), Scoper: testScopes, Lookups: Objects{}, Applier: ap, Calls: ap})
		hook.Close()
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "webhook "+hook.URL) {
			t.Errorf("%s: got %v, want %q naming the webhook", body, err, want)
		}
	}
}

// TestSyncHookOffline: offline a webhook is not called; a recorded
// response answers for it, and without one the trigger fails saying so.
func TestSyncHookOffline(t *testing.T) {
	r := syncRule(t, "http://127.0.0.1:1/never-called")
	trigger := obj("example.com/v1", "App", "ns", "web", nil)
	_, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: Objects{}, Clusters: Objects{}, Recorded: Recorded{Objects: Objects{}}})
	if err == nil || !strings.Contains(err.Error(), "offline (render, test), give its response in the test's responses") {
		t.Fatalf("got %v, want the offline webhook's error", err)
	}
	rec := Recorded{Responses: []RecordedResponse{
		{Rule: "hello", Resource: rules.SyncResourceID, Trigger: rules.ObjectRef{Kind: "App", Name: "other"}, Response: []byte(`{}`)},
		{Rule: "hello", Resource: rules.SyncResourceID, Trigger: rules.ObjectRef{Kind: "App", Name: "web"},
			Response: []byte(`{"status": {"phase": "Ready"}, "children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web-a"}}]}`)},
	}}
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: rec, Clusters: rec, Recorded: rec})
	if err != nil {
		t.Fatal(err)
	}
	status, _ := rd.Status(context.Background())
	if len(rd.Children) != 1 || rd.Children[0].Object.GetName() != "web-a" || status["phase"] != "Ready" {
		t.Errorf("children %v, status %v: want the recorded response's", rd.Children, status)
	}
}
