package offline

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// TestOfflineConflicts: render and test report a child whose name an
// object among the objects holds without syncloop's ownership, and a child
// that is what a lookup reads; such a child is not rendered as a child,
// the resources that read it wait, and the render fails.
func TestOfflineConflicts(t *testing.T) {
	l := newLoader(t)
	f, err := l.Parse("r.yaml", []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: clone}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  lookups:
    - {id: source, apiVersion: v1, kind: Secret, namespace: default, name: regcred}
  resources:
    - id: copy
      adopt: true
      template:
        apiVersion: v1
        kind: Secret
        metadata: {name: regcred, namespace: "${object.metadata.name}"}
        data: ${lookups.source.data}
    - id: note
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: note, namespace: "${object.metadata.name}"}
    - id: after
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: after, namespace: "${object.metadata.name}"}
        data: {from: "${children.note.metadata.name}"}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(f)
	if err != nil {
		t.Fatal(err)
	}
	secret := obj("v1", "Secret", "default", "regcred", nil)
	secret.Object["data"] = map[string]any{"k": "dg=="}
	userNote := obj("v1", "ConfigMap", "team", "note", map[string]any{"app": "mine"})
	out, err := Render(context.Background(), set, []*unstructured.Unstructured{
		obj("v1", "Namespace", "", "default", nil), obj("v1", "Namespace", "", "team", nil), secret, userNote}, "")
	if err != nil {
		t.Fatal(err)
	}
	if !out.Failed() {
		t.Error("a render with conflicts did not fail")
	}
	byTrigger := map[string]Result{}
	for _, r := range out.Results {
		byTrigger[r.Trigger.Name] = r
	}
	def := byTrigger["default"]
	if len(def.Conflicts) != 1 || def.Conflicts[0].Object.Name != "regcred" || !strings.Contains(def.Conflicts[0].Message, `is the object lookup "source" reads`) {
		t.Errorf("default: conflicts %+v; want the source, whatever adopt says", def.Conflicts)
	}
	for _, c := range def.Children {
		if refOfMap(c).Name == "regcred" {
			t.Error("default: the source rendered as a child")
		}
	}
	team := byTrigger["team"]
	if len(team.Conflicts) != 1 || team.Conflicts[0].Object.Name != "note" || !strings.Contains(team.Conflicts[0].Message, "exists and is not syncloop's") {
		t.Errorf("team: conflicts %+v; want the user's note", team.Conflicts)
	}
	var names []string
	for _, c := range team.Children {
		names = append(names, refOfMap(c).Name)
	}
	if strings.Join(names, ",") != "regcred" {
		t.Errorf("team: children %v; want the copy only (note conflicts, after waits for it)", names)
	}
	var yaml strings.Builder
	if err := out.WriteYAML(&yaml); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(yaml.String(), "# rule: clone, trigger: v1 Namespace team: conflict: resource \"note\": ConfigMap team/note exists and is not syncloop's") {
		t.Errorf("the YAML render does not show the conflict:\n%s", yaml.String())
	}
}

// TestOfflinePatches: offline rendering lists a mode: patch resource's
// object under patches, not children.
func TestOfflinePatches(t *testing.T) {
	f, err := newLoader(t).Parse("r.yaml", []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mark}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  resources:
    - id: ns
      mode: patch
      template:
        apiVersion: v1
        kind: Namespace
        metadata: {name: "${object.metadata.namespace}", labels: {has-apps: "true"}}
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}
`))
	if err != nil {
		t.Fatal(err)
	}
	scopes := rules.NewOfflineScope(nil)
	res := renderOne(context.Background(), render.Input{Rule: f.Rules[0], Trigger: obj("example.com/v1", "App", "shop", "web", nil), Scoper: appScope{scopes}})
	if len(res.Patches) != 1 || len(res.Children) != 1 || res.Error != "" {
		t.Errorf("offline result: %d patches, %d children, error %q; want 1 and 1", len(res.Patches), len(res.Children), res.Error)
	}
}

// appScope knows the App kind of the tests to be namespaced.
type appScope struct{ *rules.OfflineScope }

func (s appScope) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	if gvk.Kind == "App" {
		return true, nil
	}
	return s.OfflineScope.Namespaced(gvk)
}
