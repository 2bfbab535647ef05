package rules_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/render"
)

// FuzzParse (an external test: it renders with rules/render) feeds
// arbitrary bytes to the rule decoder: it must return rules
// or errors, never panic, and a rule it accepts must render without
// panicking. Seeds: every example and test rule file.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("../examples/*/*.yaml")
	seeds = append(seeds, "testdata/design.yaml")
	for _, p := range seeds {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n  watch:\n    apiVersion: v1\n    kind: Namespace\n" +
		"  resources:\n    - id: cm\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: x, namespace: ns}\n"))
	f.Add([]byte("a: &a [*a]"))
	f.Add([]byte("---\n---\n- x\n"))
	l, err := rules.NewLoader(expr.Options{CostLimit: 10_000})
	if err != nil {
		f.Fatal(err)
	}
	trigger := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": "team-a", "labels": map[string]any{"tenant": "a"}},
	}}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := l.Parse("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		for _, r := range file.Rules {
			if r.Name == "" || len(r.Hash) != 64 {
				t.Fatalf("accepted rule without name or hash: %+v", r)
			}
			rd, err := render.Rule(context.Background(), render.Input{Rule: r, Trigger: trigger, Scoper: rules.NewOfflineScope(nil)})
			if err == nil {
				_, _ = rd.Status(context.Background())
			}
		}
	})
}
