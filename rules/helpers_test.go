package rules

import (
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
