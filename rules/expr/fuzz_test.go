package expr

import (
	"context"
	"testing"
)

// FuzzTemplate compiles arbitrary template strings — as a value and as a
// map key — and renders what compiles: never a panic, and every error is a
// *TemplateError or *RenderError with a message.
func FuzzTemplate(f *testing.F) {
	for _, s := range []string{
		"plain", "${object.metadata.name}", "x-${object.metadata.name}-y", "$${literal}",
		"${{'a': '}'}['a']}", `${'it\'s'}`, "${r'\\'}", "${'''}'''}", "${", "${}", "${ }",
		"${object.spec.replicas * 2}", "${null}", "${[1, 'a', true, 1.5]}", "${b'\\xff'}",
		"${variables.tier}", "${item}", "${lists.range(10).map(i, i * i)}", "${1/0}",
		"${'a'.repeat(5)}", "${{1: 2}}", "${timestamp('2026-01-01T00:00:00Z')}",
	} {
		f.Add(s)
	}
	c, err := NewCompiler(Options{CostLimit: 10_000})
	if err != nil {
		f.Fatal(err)
	}
	act := &Activation{
		Object:    map[string]any{"metadata": map[string]any{"name": "n"}, "spec": map[string]any{"replicas": int64(2)}},
		Variables: map[string]any{"tier": "gold"},
		Rule:      "r",
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tmpl := range []any{s, map[string]any{s: "v"}, []any{s}} {
			tm, errs := c.CompileTemplate(tmpl, Scope{Variables: []string{"tier"}})
			if errs != nil {
				for _, e := range errs {
					if e.Msg == "" {
						t.Fatalf("empty compile error for %q", s)
					}
					if e.Offset > len(s) {
						t.Fatalf("offset %d beyond %q", e.Offset, s)
					}
				}
				continue
			}
			if _, err := tm.Render(context.Background(), act); err != nil && err.Error() == "" {
				t.Fatalf("empty render error for %q", s)
			}
		}
	})
}
