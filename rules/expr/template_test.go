package expr

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestSplitTemplate(t *testing.T) {
	tests := []struct {
		in   string
		want []segment
	}{
		{"plain", []segment{{text: "plain"}}},
		{"", []segment{{}}},
		{"${a}", []segment{{text: "a", isExpr: true, offset: 2}}},
		{"x-${a}-y", []segment{{text: "x-"}, {text: "a", isExpr: true, offset: 4}, {text: "-y"}}},
		{"$${a}", []segment{{text: "${a}"}}},
		{"$$${a}", []segment{{text: "$${a}"}}}, // left to right: "$", then the escape "$${"
		{"${{'k': 'v'}['k']}", []segment{{text: "{'k': 'v'}['k']", isExpr: true, offset: 2}}},
		{"${'}' + \"{\"}", []segment{{text: "'}' + \"{\"", isExpr: true, offset: 2}}},
		{`${'it\'s}'}`, []segment{{text: `'it\'s}'`, isExpr: true, offset: 2}}},
		{`${r'\'}`, []segment{{text: `r'\'`, isExpr: true, offset: 2}}},
		{"${'''}'''}", []segment{{text: "'''}'''", isExpr: true, offset: 2}}},
		{"${a}${b}", []segment{{text: "a", isExpr: true, offset: 2}, {text: "b", isExpr: true, offset: 6}}},
		{"$ {a} $", []segment{{text: "$ {a} $"}}},
	}
	for _, tt := range tests {
		got, err := splitTemplate(tt.in)
		if err != nil {
			t.Errorf("splitTemplate(%q): %v", tt.in, err)
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("splitTemplate(%q) = %+v, want %+v", tt.in, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("splitTemplate(%q)[%d] = %+v, want %+v", tt.in, i, got[i], tt.want[i])
			}
		}
	}

	for _, tt := range []struct {
		in      string
		msg     string
		wantOff int
	}{
		{"abc ${a", "unterminated ${", 4},
		{"${}", "empty ${}", 0},
		{"x${ }", "empty ${}", 1},
		{"${'abc}", "unterminated string literal", 2},
	} {
		_, err := splitTemplate(tt.in)
		if err == nil || !strings.Contains(err.Msg, tt.msg) || err.Offset != tt.wantOff {
			t.Errorf("splitTemplate(%q) error = %+v, want %q at %d", tt.in, err, tt.msg, tt.wantOff)
		}
	}
}

func TestTemplateRender(t *testing.T) {
	c := newCompiler(t, Options{})
	act := &Activation{
		Object: map[string]any{
			"metadata": map[string]any{"name": "team-a", "labels": map[string]any{"tier": "gold"}},
			"spec":     map[string]any{"replicas": int64(3), "ports": []any{int64(80), int64(443)}},
		},
		Variables: map[string]any{"tier": "gold", "enabled": false},
		Rule:      "tenant",
	}
	scope := Scope{Variables: []string{"tier", "enabled"}}
	tests := []struct {
		name string
		tmpl any
		want any
	}{
		{"constant tree", map[string]any{"a": []any{"x", int64(1), true, 1.5}},
			map[string]any{"a": []any{"x", int64(1), true, 1.5}}},
		{"whole expression keeps its type",
			map[string]any{"n": "${object.spec.replicas}", "l": "${object.spec.ports}", "m": "${object.metadata.labels}", "b": "${variables.enabled}"},
			map[string]any{"n": int64(3), "l": []any{int64(80), int64(443)}, "m": map[string]any{"tier": "gold"}, "b": false}},
		{"interpolation", map[string]any{"s": "${object.metadata.name}-${object.spec.replicas}-${variables.enabled}-${1.5}"},
			map[string]any{"s": "team-a-3-false-1.5"}},
		{"null removes a field",
			map[string]any{"keep": "x", "drop": "${variables.tier == 'gold' ? dyn(null) : 'y'}", "none": "${optional.none()}", "lit": nil},
			map[string]any{"keep": "x"}},
		{"optional value", map[string]any{"v": "${variables.tier == 'gold' ? optional.of('y') : optional.none()}"},
			map[string]any{"v": "y"}},
		{"null removes a list item", []any{"a", "${null}", "${'b'}"}, []any{"a", "b"}},
		{"templated key", map[string]any{"${object.metadata.name}-key": "v", "tier-${variables.tier}": "${rule}", "${rule}": 1, "n-${1}": 2},
			map[string]any{"team-a-key": "v", "tier-gold": "tenant", "tenant": int64(1), "n-1": int64(2)}},
		{"literal ${", map[string]any{"s": "$${HOME} and ${'x'}"}, map[string]any{"s": "${HOME} and x"}},
		{"map literal inside", map[string]any{"v": "${{'a': 'b'}.a}"}, map[string]any{"v": "b"}},
		{"spaces inside", map[string]any{"v": "${ object.metadata.name }"}, map[string]any{"v": "team-a"}},
		{"whole tree null", "${null}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm, errs := c.CompileTemplate(tt.tmpl, scope)
			if errs != nil {
				t.Fatalf("CompileTemplate: %v", errs)
			}
			got, err := tm.Render(context.Background(), act)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if !equal(got, tt.want) {
				t.Errorf("Render = %#v, want %#v", got, tt.want)
			}
		})
	}
}

func TestTemplateRenderIsFresh(t *testing.T) {
	c := newCompiler(t, Options{})
	tm, errs := c.CompileTemplate(map[string]any{"metadata": map[string]any{"labels": map[string]any{"a": "b"}}}, Scope{})
	if errs != nil {
		t.Fatal(errs)
	}
	first, _ := tm.Render(context.Background(), &Activation{})
	first.(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any)["added"] = "x"
	second, _ := tm.Render(context.Background(), &Activation{})
	if _, ok := second.(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any)["added"]; ok {
		t.Error("a change to one rendered tree leaked into the next render")
	}
}

func TestTemplateCompileErrors(t *testing.T) {
	c := newCompiler(t, Options{})
	tmpl := map[string]any{
		"metadata": map[string]any{"name": "x-${objet.name}"},
		"spec": map[string]any{
			"list":        []any{"ok", "${variables.nope}"},
			"${item}-key": "v",
			"bad":         "${unterminated",
		},
	}
	_, errs := c.CompileTemplate(tmpl, Scope{})
	got := map[string]*TemplateError{}
	for _, e := range errs {
		got[e.Path.String()] = e
	}
	want := []struct {
		path, msg string
		key       bool
		offset    int
	}{
		{"metadata.name", "${objet.name}: undeclared reference to 'objet'", false, 4},
		{"spec.list[1]", `${variables.nope}: undeclared variable "nope"`, false, 12},
		{"spec.${item}-key", "undeclared reference to 'item'", true, 2},
		{"spec.bad", "unterminated ${", false, 0},
	}
	if len(errs) != len(want) {
		t.Errorf("got %d errors, want %d: %v", len(errs), len(want), errs)
	}
	for _, w := range want {
		e := got[w.path]
		if e == nil {
			t.Errorf("no error at %s", w.path)
			continue
		}
		if !strings.Contains(e.Msg, w.msg) || e.Key != w.key || e.Offset != w.offset {
			t.Errorf("error at %s = {%q key=%v offset=%d}, want {%q key=%v offset=%d}", w.path, e.Msg, e.Key, e.Offset, w.msg, w.key, w.offset)
		}
	}
}

func TestTemplateRenderErrors(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 5_000})
	act := &Activation{Object: map[string]any{"metadata": map[string]any{"name": "a"}}}
	tests := []struct {
		name     string
		tmpl     any
		wantPath string
		wantMsg  string
	}{
		{"missing key", map[string]any{"spec": map[string]any{"v": "${object.spec.x}"}}, "spec.v", "no such key: spec"},
		{"map interpolated", map[string]any{"v": "x-${object.metadata}"}, "v", "must give a string, number or bool, gave a map"},
		{"null interpolated", map[string]any{"v": "x-${null}"}, "v", "gave null"},
		{"non-string map key in value", map[string]any{"v": "${{1: 'a'}}"}, "v", "map key 1 is a int, want string"},
		{"key not a string", map[string]any{"${1}": "x"}, "${1}", "a map key must give a string, gave int64"},
		{"duplicate rendered key", map[string]any{"a": "x", "${'a'}": "y"}, "a", `key "a" rendered twice`},
		{"cost limit", map[string]any{"v": "${lists.range(100).map(a, lists.range(100).map(b, a*b)).size()}"}, "v", "cost limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm, errs := c.CompileTemplate(tt.tmpl, Scope{})
			if errs != nil {
				t.Fatalf("CompileTemplate: %v", errs)
			}
			_, err := tm.Render(context.Background(), act)
			var re *RenderError
			if !errors.As(err, &re) {
				t.Fatalf("Render error = %v, want *RenderError", err)
			}
			if re.Path.String() != tt.wantPath || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Render error = %q at %q, want %q at %q", err, re.Path, tt.wantMsg, tt.wantPath)
			}
		})
	}
}
