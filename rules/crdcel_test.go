package rules

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/syncloop/syncloop/internal/testenv"
)

// validationLimitCases are kinds' schemas at the API server's limits on
// validations, with what loading the rule says (want: "" loads) and what
// the API server says of the CRD (server: "" takes it).
var validationLimitCases = []struct {
	name, api, want, server string
}{
	// kro's Simple Schema page's first field: a rule run once, on a
	// string of any length.
	{"immutable string", "spec:\n  name: string | required=true immutable=true description=\"My Name\"\n", "", ""},
	{"immutable bounded string", "spec:\n  name: string | immutable=true maxLength=63\n", "", ""},
	{"quadratic over a list without maxItems", "spec:\n  l: '[]string | validation=\"self.all(x, self.exists(y, y == x))\"'\n",
		"spec.api.spec.l: the rule may cost 345882608639724752, more than the API server allows one rule (10000000)", "estimated rule cost exceeds budget"},
	{"quadratic over 100 strings without maxLength", "spec:\n  l: '[]string | maxItems=100 validation=\"self.all(x, self.exists(y, y == x))\"'\n",
		"spec.api.spec.l: the rule may cost 3145790502", "estimated rule cost exceeds budget"},
	{"a rule on 10 items", "spec:\n  l: '[]T | maxItems=10'\ntypes:\n  T: string | validation=\"self.matches('^a+b$')\"\n", "", ""},
	{"a rule on 20 items", "spec:\n  l: '[]T | maxItems=20'\ntypes:\n  T: string | validation=\"self.matches('^a+b$')\"\n",
		"spec.api.spec.l: the rule may cost 12582940, more than the API server allows one rule (10000000), checked on up to 20 values", "estimated rule cost exceeds budget"},
	{"rules under the limit each, over it together", "spec:\n" + manyLists(17) + "types:\n  T: string | validation=\"self.matches('^a+b$')\"\n",
		"spec.api: the kind's validations together may cost 106954990, more than the API server allows one kind (100000000)", "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget"},
	{"immutable items of a list", "spec:\n  l: \"[]T\"\ntypes:\n  T: string | immutable=true maxLength=10\n",
		"spec.api.spec.l: oldSelf (immutable=true) compares a value with its old one, which the API server cannot find for an item of spec.l", "oldSelf cannot be used on the uncorrelatable portion of the schema"},
	{"immutable fields of a keyed list's items", "spec:\n  l: '[]P | listType=map listMapKey=name'\ntypes:\n  P:\n    name: string | required=true\n    port: integer | immutable=true\n", "", ""},
}

// manyLists is n fields l0…, each a list of up to 10 T.
func manyLists(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  l%d: '[]T | maxItems=10'\n", i)
	}
	return b.String()
}

// TestValidationLimits: a kind's validations load exactly when the API
// server takes them, held to its limits as it holds them: a rule's cost
// times how often it may run in one object (once for a field of spec),
// all of a kind's together, and oldSelf only where an old value can be
// found. Before, a rule run once on a string of any length (kro's
// immutable=true) was refused.
func TestValidationLimits(t *testing.T) {
	var dc dynamic.Interface
	if !testing.Short() {
		var err error
		if dc, err = dynamic.NewForConfig(testenv.Get(t).Config()); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range validationLimitCases {
		t.Run(tt.name, func(t *testing.T) {
			doc := head + "  api:\n    apiVersion: limits.example.com/v1\n    kind: Limit\n" + indent(tt.api, "    ") + cm
			_, err := newLoader(t).Parse("r.yaml", []byte(doc))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v, want one with %q", err, tt.want)
			}
			if dc == nil {
				return
			}
			err = dryRunCRD(t, dc, tt.api)
			switch {
			case tt.server == "" && err != nil:
				t.Errorf("the API server refused the CRD: %v", err)
			case tt.server != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.server)):
				t.Errorf("the API server: %v; want it to refuse the CRD with %q", err, tt.server)
			}
		})
	}
}

func indent(s, by string) string {
	return by + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+by) + "\n"
}

// dryRunCRD asks the API server whether it takes a CRD whose spec is the
// simple schema api (spec and types), without making it.
func dryRunCRD(t *testing.T, dc dynamic.Interface, api string) error {
	t.Helper()
	s, errs := compileAPI(t, api)
	if len(errs) > 0 {
		t.Fatalf("the schema does not compile: %v", errs)
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "limits.limits.example.com"},
		"spec": map[string]any{
			"group": "limits.example.com", "scope": "Namespaced",
			"names": map[string]any{"kind": "Limit", "plural": "limits", "singular": "limit", "listKind": "LimitList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "required": []any{"spec"},
					"properties": map[string]any{"spec": jsonValue(t, s)}}}}},
		},
	}}
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	_, err := crds.Create(t.Context(), crd, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// jsonValue is v as JSON decodes it.
func jsonValue(t *testing.T, v any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
