package render

import (
	"context"
	"reflect"
	"testing"

	"github.com/syncloop/syncloop/rules"
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
		rd, err := Rule(context.Background(), f.Rules[0], trigger, testScopes, nil, nil)
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
