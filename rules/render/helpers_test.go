package render

import (
	"testing"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// The rule fixtures of the rules package's tests, for the renders here.

// head is the first five lines of a rule document; spec's fields start on
// line 6, indented by two.
const head = "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n"

// watchNS is a valid watch (lines 6-8).
const watchNS = "  watch:\n    apiVersion: v1\n    kind: Namespace\n"

// cm is a valid resource list (from its line on: 6 lines).
const cm = "  resources:\n    - id: cm\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: x, namespace: ns}\n"

func newLoader(t testing.TB) *rules.Loader {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}
