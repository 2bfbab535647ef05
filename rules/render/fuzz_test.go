package render

import (
	"errors"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/syncloop/syncloop/rules/expr"
)

// FuzzDecodeAnswers decodes arbitrary bytes as each answer a function or
// hook gives — a resource function's output, a sync (or finalize) hook's
// response, a customize hook's — under a small render budget: never a
// panic, a refusal for want of budget or depth wraps expr.ErrTooLarge,
// and what the measure counts of JSON that decodes is at least what
// decoding makes (so that the budget is charged for no less).
func FuzzDecodeAnswers(f *testing.F) {
	for _, s := range []string{
		`{"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}]}`,
		`{"status": {"ready": true}, "children": [], "resyncAfterSeconds": 1e-9, "finalized": false}`,
		`{"relatedResources": [{"apiVersion": "v1", "resource": "configmaps", "names": ["a"], "labelSelector": {"matchLabels": {"a": "b"}}}]}`,
		`{"children": [[], [], []]}`, `[[[[[[[[[[]]]]]]]]]]`, `{"a": "\u00e9\"]}", "a": 1}`, "{\"\xff\": \"\xfe\"}",
		`{"children": null}`, `null`, `"x"`, `1e400`, `{`, `]`, `{"a":}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const budget = 1 << 20
		_, err := decodeOutput(data, expr.NewBudget(budget))
		tooLarge := errors.Is(err, expr.ErrTooLarge)
		if _, err := decodeSyncResponse(data, expr.NewBudget(budget)); errors.Is(err, expr.ErrTooLarge) != tooLarge {
			t.Fatalf("the output refused as too large: %v, the sync response: %v", tooLarge, err)
		}
		if _, err := decodeCustomizeResponse(data, expr.NewBudget(budget)); errors.Is(err, expr.ErrTooLarge) != tooLarge {
			t.Fatalf("the output refused as too large: %v, the customize response: %v", tooLarge, err)
		}
		measured, err := measureJSON(data)
		var v any
		if err != nil || utiljson.Unmarshal(data, &v) != nil {
			return
		}
		var got expr.Shape
		shapeOf(v, &got)
		if !atLeast(measured, got) {
			t.Fatalf("%q: measured %v, decoded %v", data, measured, got)
		}
	})
}
