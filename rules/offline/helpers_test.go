package offline

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

func newLoader(t testing.TB) *rules.Loader {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func obj(apiVersion, kind, ns, name string, labels map[string]any) *unstructured.Unstructured {
	md := map[string]any{"name": name, "uid": "uid-" + name}
	if ns != "" {
		md["namespace"] = ns
	}
	if labels != nil {
		md["labels"] = labels
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": md}}
}
