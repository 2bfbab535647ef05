package rules

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

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
	env := testenv.Get(t)
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	scope := NewOfflineScope(nil)
	checked := 0
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") {
				continue // subresource
			}
			gvk := gv.WithKind(r.Kind)
			got, err := scope.Namespaced(gvk)
			if err != nil {
				t.Errorf("%s (%s) is served but unknown offline: %v", gvk, r.Name, err)
				continue
			}
			if got != r.Namespaced {
				t.Errorf("%s: offline namespaced=%v, API server says %v", gvk, got, r.Namespaced)
			}
			checked++
		}
	}
	if checked < 50 {
		t.Errorf("checked only %d kinds", checked)
	}
	t.Logf("checked %d built-in kinds", checked)
}

// TestBuiltinSchemasMatchAPIServer: every kind a real kube-apiserver
// serves has its schema compiled in (hack/openapi-snapshot refreshes it),
// with the same top-level fields as the server's OpenAPI v3.
func TestBuiltinSchemasMatchAPIServer(t *testing.T) {
	env := testenv.Get(t)
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	_, lists, err := dc.ServerGroupsAndResources()
	if err != nil {
		t.Fatal(err)
	}
	live := &resolver.ClientDiscoveryResolver{Discovery: dc}
	checked := 0
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") {
				continue // subresource
			}
			gvk := gv.WithKind(r.Kind)
			ours := kinds.Builtin().Schema(gvk)
			if ours == nil {
				t.Errorf("%s is served but has no compiled-in schema", gvk)
				continue
			}
			theirs, err := live.ResolveSchema(gvk)
			if err != nil {
				t.Fatalf("%s: %v", gvk, err)
			}
			if a, b := fmt.Sprint(slices.Sorted(maps.Keys(ours.Properties))), fmt.Sprint(slices.Sorted(maps.Keys(theirs.Properties))); a != b {
				t.Errorf("%s: compiled-in fields %s, the API server's %s", gvk, a, b)
			}
			checked++
		}
	}
	if checked < 50 {
		t.Errorf("checked only %d kinds", checked)
	}
}
