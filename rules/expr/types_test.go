package expr

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"

	kinds "github.com/syncloop/syncloop/rules/schema"
)

// widgetCRD has typed fields, a preserve-unknown-fields subtree, a map, an
// int-or-string, a date-time and a number.
const widgetSchema = `{
  "type": "object",
  "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
    "metadata": {"type": "object", "properties": {"name": {"type": "string"}, "creationTimestamp": {"type": "string", "format": "date-time"}}},
    "spec": {"type": "object", "properties": {
      "size": {"type": "integer"},
      "ratio": {"type": "number"},
      "port": {"x-kubernetes-int-or-string": true},
      "labels": {"type": "object", "additionalProperties": {"type": "string"}},
      "values": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
      "ports": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}},
      "expires": {"type": "string", "format": "date-time"}
    }}
  }
}`

func typesFor(t *testing.T, c *Compiler) *Types {
	t.Helper()
	var s spec.Schema
	if err := json.Unmarshal([]byte(widgetSchema), &s); err != nil {
		t.Fatal(err)
	}
	b := kinds.Builtin()
	deploy := c.KindType("apps/v1.Deployment", b.Schema(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}))
	secret := c.KindType("v1.Secret", b.Schema(schema.GroupVersionKind{Version: "v1", Kind: "Secret"}))
	if deploy == nil || secret == nil {
		t.Fatal("no built-in schema for Deployment or Secret")
	}
	return &Types{
		Object:   c.KindType("example.com/v1.Widget", &s),
		Lookups:  map[string]*Type{"token": secret, "all": ListOf(secret)},
		Children: map[string]*Type{"app": deploy, "apps": ListOf(deploy)},
	}
}

func TestTypedCompileErrors(t *testing.T) {
	c := newCompiler(t, Options{})
	ts := typesFor(t, c)
	scope := Scope{Types: ts, Lookups: []string{"token", "all"}, Children: []string{"app", "apps"}}
	tests := []struct {
		name, src  string
		want       Result
		wantMsg    string
		wantOffset int
	}{
		{"misspelt trigger field", "object.spec.szie > 1", BoolResult,
			`example.com/v1.Widget.spec has no field "szie" (did you mean "size"?)`, 12},
		{"misspelt child field", "children.app.spec.replicsa", AnyResult,
			`apps/v1.Deployment.spec has no field "replicsa" (did you mean "replicas"?)`, 18},
		{"misspelt lookup field", "lookups.token.dta", AnyResult, `v1.Secret has no field "dta" (did you mean "data"?)`, 14},
		{"forEach over a string", "object.metadata.name", ListResult, "must produce a list, but produces string", -1},
		{"when over an int", "object.spec.size", BoolResult, "must produce a bool, but produces int", -1},
		{"int compared to string", "object.spec.size == 'big'", BoolResult, "no matching overload for '_==_' applied to '(int, string)'", 17},
		{"string function on a timestamp", "object.spec.expires.startsWith('2026')", BoolResult, "found no matching overload for 'startsWith'", 30},
		{"field of a list", "children.apps.spec", AnyResult, "type 'list(apps/v1.Deployment)' does not support field selection", 13},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCompileError(t, c, tt.src, scope, tt.want, tt.wantMsg, tt.wantOffset)
		})
	}
}

func TestTypedEval(t *testing.T) {
	c := newCompiler(t, Options{})
	ts := typesFor(t, c)
	scope := Scope{Types: ts, Lookups: []string{"token", "all"}, Children: []string{"app", "apps"}}
	act := &Activation{
		Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": "w", "creationTimestamp": "2026-12-01T01:02:03Z"},
			"spec": map[string]any{
				"size": int64(3), "ratio": int64(2), "port": "http",
				"labels":  map[string]any{"tier": "gold"},
				"values":  map[string]any{"deep": map[string]any{"x": int64(1)}},
				"ports":   []any{map[string]any{"name": "http", "port": int64(80)}, map[string]any{"name": "metrics", "port": int64(9090)}},
				"expires": "2027-01-01T00:00:00Z",
			}},
		Lookups: map[string]any{
			"token": map[string]any{"data": map[string]any{"token": "c2VjcmV0"}},
			"all":   []any{map[string]any{"data": map[string]any{"a": "YQ=="}}},
		},
		Children: map[string]any{
			"app":  map[string]any{"spec": map[string]any{"replicas": int64(2)}, "status": map[string]any{"conditions": []any{map[string]any{"type": "Available", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}}}},
			"apps": []any{},
		},
	}
	tests := []struct {
		src  string
		want any
	}{
		{"object.spec.size * 2", int64(6)},
		{"object.spec.ratio / 4.0", 0.5},                                 // a whole number in a number field is a double
		{"object.metadata.creationTimestamp.getFullYear()", int64(2026)}, // date-time is a timestamp
		{"object.spec.expires - object.metadata.creationTimestamp > duration('700h')", true},
		{"string(lookups.token.data.token)", "secret"}, // byte is bytes
		{"lookups.token.data.token", "c2VjcmV0"},       // and renders as base64 again
		{"string(lookups.all[0].data.a)", "a"},
		{"object.spec.values.deep.x + 1", int64(2)}, // preserve-unknown is dyn
		{"type(object.spec.port) == string", true},  // int-or-string is dyn
		{"object.spec.labels.tier", "gold"},
		{"object.spec.ports.filter(p, p.port > 100).map(p, p.name)", []any{"metrics"}},
		{"children.app.spec.replicas + 1", int64(3)},
		{"children.app.status.conditions.exists(c, c.type == 'Available' && c.lastTransitionTime < timestamp('2027-01-01T00:00:00Z'))", true},
		{"has(children.app.spec.paused)", false},
		{"object.metadata == object.metadata", true},
		{"size(children.apps)", int64(0)},
		{"object.metadata", map[string]any{"name": "w", "creationTimestamp": "2026-12-01T01:02:03Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			p, err := c.Compile(tt.src, scope, AnyResult)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Eval(context.Background(), act)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("= %#v, want %#v", got, tt.want)
			}
		})
	}
}

// A forEach's items are typed by what it iterates over.
func TestTypedItem(t *testing.T) {
	c := newCompiler(t, Options{})
	ts := typesFor(t, c)
	fe, err := c.Compile("object.spec.ports", Scope{Types: ts}, ListResult)
	if err != nil {
		t.Fatal(err)
	}
	if fe.Elem() == nil {
		t.Fatal("the items of object.spec.ports have no type")
	}
	scope := Scope{Types: ts, ForEach: true, Item: fe.Elem()}
	if _, err := c.Compile("item.prot", scope, AnyResult); err == nil || !strings.Contains(err.Error(), `did you mean "port"?`) {
		t.Errorf("item.prot: error = %v, want an unknown field", err)
	}
	p, err := c.Compile("item.port + index", scope, AnyResult)
	if err != nil {
		t.Fatal(err)
	}
	if p.Output() != TypeInt {
		t.Errorf("item.port + index produces %v, want an int", p.Output())
	}
	items, err := fe.EvalList(context.Background(), &Activation{Object: map[string]any{"spec": map[string]any{"ports": []any{map[string]any{"port": int64(80)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Eval(context.Background(), &Activation{Item: items[0], Index: 1})
	if err != nil || got != int64(81) {
		t.Errorf("item.port + index = %v, %v; want 81", got, err)
	}
}

// self in readyWhen is the child's kind.
func TestTypedSelf(t *testing.T) {
	c := newCompiler(t, Options{})
	ts := typesFor(t, c)
	deploy := ts.Children["app"]
	scope := Scope{Self: true, SelfType: deploy}
	if _, err := c.Compile("self.status.readyReplica == 1", scope, BoolResult); err == nil || !strings.Contains(err.Error(), `did you mean "readyReplicas"?`) {
		t.Errorf("error = %v, want an unknown field", err)
	}
	p, err := c.Compile("self.status.readyReplicas == self.spec.replicas", scope, BoolResult)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := p.EvalBool(context.Background(), &Activation{Self: map[string]any{"spec": map[string]any{"replicas": int64(2)}, "status": map[string]any{"readyReplicas": int64(2)}}})
	if err != nil || !ok {
		t.Errorf("= %v, %v; want true", ok, err)
	}
}

// The rule's environment declares every name; a scope without one rejects
// it as the checker would, unless a comprehension binds it.
func TestTypedScopes(t *testing.T) {
	c := newCompiler(t, Options{})
	ts := typesFor(t, c)
	tests := []struct {
		src     string
		scope   Scope
		wantMsg string
	}{
		{"item.name", Scope{Types: ts}, "undeclared reference to 'item'"},
		{"index + 1", Scope{Types: ts}, "undeclared reference to 'index'"},
		{"children.app", Scope{Types: ts}, "undeclared reference to 'children'"},
		{"ready.app", Scope{Types: ts, Children: []string{"app"}}, "undeclared reference to 'ready'"},
		{"object.spec.ports.map(item, item.name)", Scope{Types: ts}, ""},
		{"object.spec.ports.all(i, p, p.port > index)", Scope{Types: ts}, "undeclared reference to 'index'"},
		{"ready.app && children.app.spec.replicas > 0", Scope{Types: ts, Children: []string{"app"}, Status: true}, ""},
		{"item.port + index", Scope{Types: ts, ForEach: true}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.src, func(t *testing.T) {
			_, err := c.Compile(tt.src, tt.scope, AnyResult)
			switch {
			case tt.wantMsg == "" && err != nil:
				t.Errorf("error = %v, want none", err)
			case tt.wantMsg != "" && (err == nil || !strings.Contains(err.Error(), tt.wantMsg)):
				t.Errorf("error = %v, want %q", err, tt.wantMsg)
			}
		})
	}
}

// A template compiled before anything else of its rule converts the
// values it reads all the same.
func TestTypedTemplateFirst(t *testing.T) {
	c := newCompiler(t, Options{})
	ts := typesFor(t, c) // nothing compiled with it yet
	tm, errs := c.CompileTemplate(map[string]any{"token": "${string(lookups.token.data.token)}", "ca": "${base64.encode(lookups.token.data.token)}"},
		Scope{Types: ts, Lookups: []string{"token", "all"}})
	if errs != nil {
		t.Fatal(errs)
	}
	got, err := tm.Render(context.Background(), &Activation{Lookups: map[string]any{"token": map[string]any{"data": map[string]any{"token": "c2VjcmV0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"token": "secret", "ca": "c2VjcmV0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("= %v, want %v", got, want)
	}
}
