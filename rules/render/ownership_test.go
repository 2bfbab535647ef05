package render

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
)

// TestTakeover: which existing objects a rule's child may be applied over.
func TestTakeover(t *testing.T) {
	r := parseRule(t, `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: r}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: plain
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: ns}}
    - id: adopting
      adopt: true
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: y, namespace: ns}}
`)
	trigger := rules.Trigger{ObjectRef: rules.ObjectRef{APIVersion: "v1", Kind: "Namespace", Name: "ns"}, UID: "u1"}
	existing := func(labels, ann map[string]string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
		o.SetName("x")
		o.SetNamespace("ns")
		o.SetLabels(labels)
		o.SetAnnotations(ann)
		return o
	}
	ours := map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "r", rules.LabelOwnerUID: "u0"}
	owner := map[string]string{rules.AnnotationOwner: "v1/Namespace//ns"}
	tests := []struct {
		name          string
		labels, ann   map[string]string
		plain, adopts string // "own", "adopt", or the conflict's text
	}{
		{"this trigger's child", ours, owner, "own", "own"},
		{"this trigger's child under another version of its kind", ours, map[string]string{rules.AnnotationOwner: "v2/Namespace//ns"}, "own", "own"},
		{"unlabelled", map[string]string{"team": "a"}, nil, "exists and is not syncloop's", "adopt"},
		{"Helm's", map[string]string{rules.LabelManagedBy: "Helm"}, nil, "exists and is not syncloop's", "adopt"},
		{"annotated for this rule", nil, map[string]string{rules.AnnotationAdopt: "r"}, "adopt", "adopt"},
		{"annotated for another rule", nil, map[string]string{rules.AnnotationAdopt: "q"}, "exists and is not syncloop's", "adopt"},
		{"another rule's", map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "q"}, owner, `is a child of rule "q"`, `is a child of rule "q"`},
		{"another trigger's", ours, map[string]string{rules.AnnotationOwner: "v1/Namespace//other"}, "another trigger (v1/Namespace//other)", "another trigger"},
		{"another rule's, annotated for this one", map[string]string{rules.LabelRule: "q"}, map[string]string{rules.AnnotationAdopt: "r"}, `is a child of rule "q"`, `is a child of rule "q"`},
		{"only the owner annotation", nil, owner, "another syncloop's ownership", "another syncloop's ownership"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, want := range []string{tt.plain, tt.adopts} {
				res := r.Resources[i]
				adopt, err := Takeover(r, Child{ResourceID: res.ID, Resource: res, Object: existing(nil, nil)}, trigger, existing(tt.labels, tt.ann))
				var got string
				switch {
				case err != nil:
					var ce *ConflictError
					if !errors.As(err, &ce) {
						t.Fatalf("%s: %v is not a ConflictError", res.ID, err)
					}
					got = err.Error()
				case adopt:
					got = "adopt"
				default:
					got = "own"
				}
				if !strings.Contains(got, want) {
					t.Errorf("%s: got %q, want %q", res.ID, got, want)
				}
			}
		})
	}
}

// TestInstallations: a child is an installation's own only with its name
// (none for the default installation); the child of another installation
// — the default one included — is never taken over, adopt or not; field
// managers name the installation.
func TestInstallations(t *testing.T) {
	res := &rules.Resource{ID: "c", Lifecycle: rules.Lifecycle{Adopt: true}}
	trigger := rules.Trigger{ObjectRef: rules.ObjectRef{APIVersion: "v1", Kind: "Namespace", Name: "ns"}}
	child := func(installation string) *unstructured.Unstructured {
		o := obj("v1", "ConfigMap", "ns", "c", nil)
		l := map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "r"}
		if installation != "" {
			l[rules.LabelInstallation] = installation
		}
		o.SetLabels(l)
		o.SetAnnotations(map[string]string{rules.AnnotationOwner: "v1/Namespace//ns"})
		return o
	}
	for _, tt := range []struct {
		rule, object, want string // want "" : owned
	}{
		{"", "", ""},
		{"team-a", "team-a", ""},
		{"", "team-a", `belongs to installation "team-a" of syncloop`},
		{"team-a", "", "belongs to the default installation of syncloop"},
		{"team-a", "team-b", `belongs to installation "team-b" of syncloop`},
	} {
		r := &rules.Rule{Name: "r", Installation: tt.rule}
		adopt, err := Takeover(r, Child{ResourceID: "c", Resource: res, Object: child("")}, trigger, child(tt.object))
		got := ""
		if err != nil {
			got = err.Error()
		}
		if adopt || (tt.want == "" && err != nil) || !strings.Contains(got, tt.want) {
			t.Errorf("rule of %q, child of %q: adopt %v, err %v; want %q", tt.rule, tt.object, adopt, err, tt.want)
		}
	}
	if m := (&rules.Rule{Name: "r"}).FieldManager(); m != "syncloop/r" {
		t.Errorf("default installation's field manager %q", m)
	}
	if m := (&rules.Rule{Name: "r", Installation: "team-a"}).FieldManager(); m != "syncloop@team-a/r" {
		t.Errorf("team-a's field manager %q", m)
	}

	l := newLoader(t)
	if err := l.SetInstallation("Team_A"); err == nil {
		t.Error("an installation name that is no label value was accepted")
	}
	if err := l.SetInstallation("team-a"); err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("r.yaml", []byte(head+watchNS+cm))
	if err != nil {
		t.Fatal(err)
	}
	rd, err := Rule(context.Background(), Input{Rule: f.Rules[0], Trigger: obj("v1", "Namespace", "", "ns", nil), Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	if got := rd.Children[0].Object.GetLabels()[rules.LabelInstallation]; got != "team-a" {
		t.Errorf("a child of installation team-a is labelled %q", got)
	}
}
