package rules

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules/function"
)

// moduleVersion is unreachableModule with a custom section named v: the
// same program, other bytes, another digest.
func moduleVersion(v string) []byte {
	custom := append(append([]byte{0x00, byte(2 + len(v)), byte(len(v))}, v...), 'x') // its name, and a byte
	return append(append([]byte(nil), unreachableModule...), custom...)
}

// loadFunctionRule loads, with l, the rule r whose resource fn calls the
// module of version v, from a directory of its own; and its rule
// function, with a finalize hook calling version v+"-finalize", when
// sync.
func loadFunctionRule(t *testing.T, l *Loader, v string, sync bool) *Rule {
	t.Helper()
	dir := t.TempDir()
	for name, version := range map[string]string{"fn.wasm": v, "finalize.wasm": v + "-finalize"} {
		if err := os.WriteFile(filepath.Join(dir, name), moduleVersion(version), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	doc := head + watchNS + functionResource("      kinds: [{apiVersion: v1, kind: ConfigMap}]\n      function: {wasm: fn.wasm}\n")
	if sync {
		doc = head + watchNS + "  function:\n    kinds: [{apiVersion: v1, kind: ConfigMap}]\n    wasm: fn.wasm\n    finalize: {wasm: finalize.wasm}\n"
	}
	f, err := l.Parse(filepath.Join(dir, "r.yaml"), []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return f.Rules[0]
}

// calls reports whether r's functions' modules can still be called: a
// call of each traps (unreachable) rather than failing as closed.
func calls(t *testing.T, r *Rule) bool {
	t.Helper()
	mods := r.modules()
	if len(mods) == 0 {
		t.Fatal("the rule calls no module")
	}
	for _, m := range mods {
		_, err := m.Call(t.Context(), []byte("{}"), function.DefaultLimits)
		if err == nil || !strings.Contains(err.Error(), "unreachable") {
			return false
		}
	}
	return true
}

// TestReleaseModules: the compiled module of a rule's old version, which
// no rule in force calls, is closed at the second release after the rule
// changed — the first only marks it, so that a module a load compiled
// for a set not yet in force is kept — while a module a rule in force
// calls, such as the revision a rollout moves from, is kept however many
// releases pass; a hook's module counts as its function's. Loading the
// old version's file again compiles it anew.
func TestReleaseModules(t *testing.T) {
	l := newLoader(t)
	ctx := context.Background()
	v1 := loadFunctionRule(t, l, "v1", false)
	v2 := loadFunctionRule(t, l, "v2", false)
	hooked := loadFunctionRule(t, l, "h", true)
	if len(hooked.modules()) != 2 {
		t.Fatalf("the rule function with a finalize hook calls %d modules, want 2", len(hooked.modules()))
	}

	// In a rollout from v1 to v2, both are in force.
	for range 3 {
		if n := l.ReleaseModules(ctx, []*Rule{v2, v1, hooked}); n != 0 {
			t.Fatalf("released %d modules the rules in force call", n)
		}
	}
	if !calls(t, v1) || !calls(t, v2) || !calls(t, hooked) {
		t.Fatal("a module in force was closed")
	}

	// The rollout done, v1 is no longer in force.
	if n := l.ReleaseModules(ctx, []*Rule{v2, hooked}); n != 0 || !calls(t, v1) {
		t.Fatalf("the first release after v1 left closed %d modules (v1 callable: %v); want it only marked", n, calls(t, v1))
	}
	if n := l.ReleaseModules(ctx, []*Rule{v2, hooked}); n != 1 || calls(t, v1) {
		t.Fatalf("the second release closed %d modules (v1 callable: %v); want v1's closed", n, calls(t, v1))
	}
	if !calls(t, v2) || !calls(t, hooked) {
		t.Error("a module in force was closed with v1's")
	}
	if len(l.functions.byDigest) != 3 {
		t.Errorf("the store keeps %d modules, want 3 (v2's, the hooked rule's two)", len(l.functions.byDigest))
	}

	// A module loaded between two releases is kept by the second.
	l.ReleaseModules(ctx, []*Rule{v2, hooked})
	again := loadFunctionRule(t, l, "v1", false) // not in force yet
	if n := l.ReleaseModules(ctx, []*Rule{v2, hooked}); n != 0 || !calls(t, again) {
		t.Errorf("a module loaded since the last release: %d closed, callable %v", n, calls(t, again))
	}
	// Nothing in force: all go, in two releases (again, marked by the
	// last, in the first).
	if n := l.ReleaseModules(ctx, nil) + l.ReleaseModules(ctx, nil); n != 4 || len(l.functions.byDigest) != 0 {
		t.Errorf("with no rule in force %d were closed, %d kept; want all 4 closed", n, len(l.functions.byDigest))
	}
}
