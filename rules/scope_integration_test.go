package rules

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery"

	"github.com/syncloop/syncloop/internal/testenv"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}) }

// TestOfflineScopeMatchesAPIServer checks the offline scope of every
// built-in kind against a real kube-apiserver's discovery: each kind it
// serves must be known offline, with the same scope.
func TestOfflineScopeMatchesAPIServer(t *testing.T) {
	_, served := servedKinds(t)
	scope := NewOfflineScope(nil)
	for _, k := range served {
		got, err := scope.Namespaced(k.gvk)
		if err != nil {
			t.Errorf("%s (%s) is served but unknown offline: %v", k.gvk, k.resource.Name, err)
			continue
		}
		if got != k.resource.Namespaced {
			t.Errorf("%s: offline namespaced=%v, API server says %v", k.gvk, got, k.resource.Namespaced)
		}
	}
	t.Logf("checked %d built-in kinds", len(served))
}

type servedKind struct {
	gvk      schema.GroupVersionKind
	resource metav1.APIResource
}

// servedKinds lists the kinds (no subresources) a real kube-apiserver
// serves: at least 50 of them, or the test fails.
func servedKinds(t *testing.T) (*discovery.DiscoveryClient, []servedKind) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(testenv.Get(t).Config())
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	var out []servedKind
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			if !strings.Contains(r.Name, "/") {
				out = append(out, servedKind{gvk: gv.WithKind(r.Kind), resource: r})
			}
		}
	}
	if len(out) < 50 {
		t.Fatalf("the API server serves only %d kinds", len(out))
	}
	return dc, out
}

// TestBuiltinSchemasMatchAPIServer: every kind a real kube-apiserver
// serves has its schema compiled in (hack/openapi-snapshot refreshes it),
// with the same top-level fields as the server's OpenAPI v3.
func TestBuiltinSchemasMatchAPIServer(t *testing.T) {
	dc, served := servedKinds(t)
	live := &resolver.ClientDiscoveryResolver{Discovery: dc}
	for _, k := range served {
		ours := kinds.Builtin().Schema(k.gvk)
		if ours == nil {
			t.Errorf("%s is served but has no compiled-in schema", k.gvk)
			continue
		}
		theirs, err := live.ResolveSchema(k.gvk)
		if err != nil {
			t.Fatalf("%s: %v", k.gvk, err)
		}
		if a, b := fmt.Sprint(slices.Sorted(maps.Keys(ours.Properties))), fmt.Sprint(slices.Sorted(maps.Keys(theirs.Properties))); a != b {
			t.Errorf("%s: compiled-in fields %s, the API server's %s", k.gvk, a, b)
		}
	}
}
