package rules

import (
	"os"
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules/expr"
)

// parseRule parses doc, one rule, as rule.yaml.
func parseRule(t *testing.T, doc string) *Rule {
	t.Helper()
	l, err := NewLoader(expr.Options{CostLimit: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("rule.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return f.Rules[0]
}

// checkGolden fails t unless got is the golden file's content (-update
// rewrites it); what names got in the message.
func checkGolden(t *testing.T, golden, what string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(want)) != strings.TrimSpace(string(got)) {
		t.Errorf("%s differs from %s (-update rewrites it):\n%s", what, golden, got)
	}
}
