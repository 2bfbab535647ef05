package manager

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/reload"
)

// TestReleaseOnce: a release keeps the modules the set in force calls
// and those the engine still runs (a rollout's previous revision), and
// closes — at the second release, as the loader does — one neither
// calls: the old version of a rule changed since.
func TestReleaseOnce(t *testing.T) {
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	load := func(version string) *rules.Rule {
		t.Helper()
		dir := t.TempDir()
		// unreachableWasm with a custom section naming version: another
		// digest per version.
		wasm := append(append(slices.Clip(unreachableWasm), 0x00, byte(len(version)+2), byte(len(version))), version+"x"...)
		if err := os.WriteFile(filepath.Join(dir, "fn.wasm"), wasm, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := l.Parse(filepath.Join(dir, "rules.yaml"), []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: calls}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - {id: fn, kinds: [{apiVersion: v1, kind: ConfigMap}], function: {wasm: fn.wasm}}
`))
		if err != nil {
			t.Fatal(err)
		}
		return f.Rules[0]
	}
	alive := func(r *rules.Rule) bool {
		_, err := r.Resources[0].Function.Call(t.Context(), []byte("{}"))
		return err != nil && strings.Contains(err.Error(), "unreachable")
	}
	old, previous, current := load("v1"), load("v2"), load("v3")
	set, err := rules.NewSet(&rules.File{Rules: []*rules.Rule{current}})
	if err != nil {
		t.Fatal(err)
	}
	f := &ruleFiles{src: reload.NewSource(l, nil), current: &currentSet{set: set}}
	running := func() []*rules.Rule { return []*rules.Rule{current, previous} } // rolling out from v2
	for range 2 {
		f.releaseOnce(t.Context(), running)
	}
	if alive(old) || !alive(previous) || !alive(current) {
		t.Errorf("after two releases, v1 callable %v (want not), v2 %v and v3 %v (want both)", alive(old), alive(previous), alive(current))
	}
}

// unreachableWasm is the smallest WASI command: _start is unreachable.
var unreachableWasm = []byte{0, 'a', 's', 'm', 1, 0, 0, 0, 0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02, 0x01, 0x00,
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00, 0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b}
