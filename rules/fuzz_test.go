package rules

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules/expr"
)

// FuzzParse feeds arbitrary bytes to the rule decoder: it must return rules
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
	f.Add([]byte(head + watchNS + cm))
	f.Add([]byte("a: &a [*a]"))
	f.Add([]byte("---\n---\n- x\n"))
	l, err := NewLoader(expr.Options{CostLimit: 10_000})
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
			rd, err := r.Render(context.Background(), trigger, NewOfflineScope(nil), nil, nil)
			if err == nil {
				_, _ = rd.Status(context.Background())
			}
		}
	})
}
