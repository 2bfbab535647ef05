package render

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// TestRenderDropsReservedKeys: labels and annotations a template
// computes — a trigger's copied whole, the common shape — never carry
// syncloop's own keys onto what it writes: a child gets exactly its
// rule's, trigger's and installation's marks (another installation's
// label would have the other prune it), and a patch gets none, so that a
// patched object cannot be made to look like another rule's child or
// adoptable. The trigger is not changed.
func TestRenderDropsReservedKeys(t *testing.T) {
	const copyMeta = `  resources:
    - id: own
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n, labels: "${object.metadata.labels}", annotations: "${object.metadata.annotations}"}}
    - id: patched
      mode: patch
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: b, namespace: n, labels: "${object.metadata.labels}", annotations: "${object.metadata.annotations}"}}
`
	trigger := obj("v1", "Namespace", "", "team-a", map[string]any{
		"team": "a", rules.LabelInstallation: "other", rules.LabelManagedBy: "syncloop",
		rules.LabelRule: "someone-else", rules.LabelOwnerUID: "not-this-trigger",
	})
	trigger.Object["metadata"].(map[string]any)["annotations"] = map[string]any{
		"note": "x", rules.AnnotationAdopt: "someone-else", rules.AnnotationOwner: "v1/Namespace//victim", "syncloop.dev/anything": "y",
	}
	for _, installation := range []string{"", "blue"} {
		l := newLoader(t)
		if err := l.SetInstallation(installation); err != nil {
			t.Fatal(err)
		}
		f, err := l.Parse("rule.yaml", []byte(head+watchNS+copyMeta))
		if err != nil {
			t.Fatal(err)
		}
		rd, err := Rule(context.Background(), Input{Rule: f.Rules[0], Trigger: trigger, Scoper: testScopes})
		if err != nil {
			t.Fatal(err)
		}
		own, patched := rd.Children[0].Object, rd.Children[1].Object
		wantLabels := map[string]string{"team": "a", rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "r", rules.LabelOwnerUID: "uid-team-a"}
		if installation != "" {
			wantLabels[rules.LabelInstallation] = installation
		}
		if got := own.GetLabels(); !reflect.DeepEqual(got, wantLabels) {
			t.Errorf("installation %q: the child's labels %v, want %v", installation, got, wantLabels)
		}
		wantAnn := map[string]string{"note": "x", rules.AnnotationOwner: "v1/Namespace//team-a", rules.AnnotationResourceID: "own"}
		if got := own.GetAnnotations(); !reflect.DeepEqual(got, wantAnn) {
			t.Errorf("installation %q: the child's annotations %v, want %v", installation, got, wantAnn)
		}
		if got := patched.GetLabels(); !reflect.DeepEqual(got, map[string]string{"team": "a"}) {
			t.Errorf("the patch's labels %v, want only team", got)
		}
		if got := patched.GetAnnotations(); !reflect.DeepEqual(got, map[string]string{"note": "x"}) {
			t.Errorf("the patch's annotations %v, want only note", got)
		}
	}
	if got := trigger.GetLabels(); len(got) != 5 || got[rules.LabelInstallation] != "other" {
		t.Errorf("the trigger's labels became %v", got)
	}
}

// TestRenderMaxBytes: a forEach that copies a subtree of its trigger into
// every child — the trigger read in place, each copy made anew — fails
// its trigger once what it made holds more than MaxRenderedBytes, instead
// of growing until the process is killed (a 150 KB trigger took 2 GB);
// the same rule over a few items renders.
func TestRenderMaxBytes(t *testing.T) {
	r := parseRule(t, head+watchNS+`  resources:
    - id: copies
      forEach: "dyn(object).spec.items"
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "x-${item}", namespace: n}, data: "${dyn(object).spec.cfg}"}
`)
	at := func(items int) *unstructured.Unstructured {
		cfg := map[string]any{}
		for i := range 1500 { // about 150 KB
			cfg[fmt.Sprint("key-", i)] = fmt.Sprintf("value-%090d", i)
		}
		list := make([]any, items)
		for i := range list {
			list[i] = fmt.Sprint(i)
		}
		trigger := obj("v1", "Namespace", "", "team-a", nil)
		trigger.Object["spec"] = map[string]any{"cfg": cfg, "items": list}
		return trigger
	}
	if rd, err := Rule(context.Background(), Input{Rule: r, Trigger: at(10), Scoper: testScopes}); err != nil || len(rd.Children) != 10 {
		t.Fatalf("10 copies: %v", err)
	}
	_, err := Rule(context.Background(), Input{Rule: r, Trigger: at(5000), Scoper: testScopes})
	if !errors.Is(err, expr.ErrTooLarge) {
		t.Fatalf("5,000 copies: err = %v, want one wrapping ErrTooLarge", err)
	}
	if want := `rule.yaml:12:102: rule "r": resource "copies": spec.resources[0].template.data: ${dyn(object).spec.cfg}:`; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), `resource "copies"`) || !strings.Contains(err.Error(), "more than 128 MiB") {
		t.Errorf("err = %v, want it at the template, naming the resource and the bound", err)
	}
}
