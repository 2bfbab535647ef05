package render

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/internal/panics"
)

// panicky panics in whichever of the render's dependencies it stands for:
// where code the render calls panics on what a trigger holds.
type panicky struct{}

func (panicky) Namespaced(schema.GroupVersionKind) (bool, error) { panic("scoper: injected") }
func (panicky) Lookup(context.Context, LookupQuery) ([]*unstructured.Unstructured, error) {
	panic("lookuper: injected")
}
func (panicky) Apply(context.Context, Child) (map[string]any, error) { panic("applier: injected") }
func (panicky) Observed(Child) map[string]any                        { panic("observed: injected") }

// TestRenderContainsPanics: a panic anywhere in a render — the scoper, a
// lookup, an apply — is that render's error, naming the rule and carrying
// the panic's value and stack; it never reaches the caller as a panic.
func TestRenderContainsPanics(t *testing.T) {
	r := parseRule(t, lookupRule)
	trigger := obj("v1", "Namespace", "", "a", map[string]any{"team": "x"})
	scopes := scopes{"Secret": true, "Namespace": false, "ConfigMap": true}
	secret := obj("v1", "Secret", "platform", "registry", nil)
	secret.Object["data"] = map[string]any{".dockerconfigjson": "e30="}
	objects := Objects{trigger, secret}
	tests := []struct {
		name   string
		scoper Scoper
		lk     Lookuper
		ap     Applier
		want   string
	}{
		{"scoper", panicky{}, objects, nil, "scoper: injected"},
		{"lookup", scopes, panicky{}, nil, "lookuper: injected"},
		{"apply", scopes, objects, panicky{}, "applier: injected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: tt.scoper, Lookups: tt.lk, Applier: tt.ap})
			if rd != nil {
				t.Errorf("a render that panicked returned %v", rd)
			}
			pe, ok := errors.AsType[*panics.Error](err)
			if !ok {
				t.Fatalf("err = %v, want a recovered panic", err)
			}
			if msg := err.Error(); !strings.Contains(msg, `rule "pull"`) || !strings.Contains(msg, "panic: "+tt.want) {
				t.Errorf("err = %q, want the rule and the panic's value", msg)
			}
			if !strings.Contains(string(pe.Stack), "panicky") {
				t.Errorf("the stack does not say where the panic came from:\n%s", pe.Stack)
			}
		})
	}
}
