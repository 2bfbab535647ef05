package manager

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}) }

// apiRule is a rule named name that defines kind kind.
func apiRule(name, kind string) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  api:
    apiVersion: contain.syncloop.dev/v1
    kind: %s
    spec:
      size: integer | default=1
  resources: []
---
`, name, kind)
}

// TestCRDKeeperContainsPanics: a panic while keeping one rule's CRD is
// that rule's failure — reported for /readyz with the panic, counted,
// retried (keep reports it failed) — and the other rules' CRDs are kept.
func TestCRDKeeperContainsPanics(t *testing.T) {
	env := testenv.Get(t)
	c, err := NewClients(env.Config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("api.yaml", []byte(apiRule("bad", "Bad")+apiRule("good", "Good")))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(f)
	if err != nil {
		t.Fatal(err)
	}
	k := newCRDKeeper(c, true)
	var mu sync.Mutex
	panicked := map[string]int{}
	k.applied = func(rule, result string) {
		if rule == "bad" && result == "created" {
			panic("injected after applying " + rule)
		}
	}
	k.panicked = func(rule, where string) {
		mu.Lock()
		defer mu.Unlock()
		panicked[rule+" "+where]++
	}
	if !k.keep(t.Context(), set) {
		t.Error("keep reports no failure: it would not be retried")
	}
	if got := k.failed(); len(got) != 1 || !strings.Contains(got[0], "(rule bad)") || !strings.Contains(got[0], "panic: injected after applying bad") {
		t.Errorf("failures %q, want the bad rule's panic alone", got)
	}
	if panicked["bad "+panicCRDs] != 1 || len(panicked) != 1 {
		t.Errorf("panics counted %v, want one for rule bad at %s", panicked, panicCRDs)
	}
	crd, err := k.crds.Get(t.Context(), "goods.contain.syncloop.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the good rule's CRD: %v", err)
	}
	if ok, err := crdEstablished(crd); !ok || err != nil {
		t.Errorf("the good rule's CRD is not established: %v", err)
	}
}
