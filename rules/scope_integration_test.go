package rules

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/syncloop/syncloop/internal/testenv"
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
