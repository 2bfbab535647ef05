package engine

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

var (
	fnOnce    sync.Once
	fnModules map[string]string // version → the module's directory
	fnErr     error
)

// fnModule is testdata/fn built for WebAssembly at version v1 or v2, in a
// directory of its own (as fn.wasm); built once per test process.
func fnModule(t *testing.T, version string) string {
	t.Helper()
	fnOnce.Do(func() {
		fnModules = map[string]string{}
		for _, v := range []string{"v1", "v2"} {
			dir, err := os.MkdirTemp("", "syncloop-fn-"+v+"-")
			if err != nil {
				fnErr = err
				return
			}
			cmd := exec.Command("go", "build", "-ldflags", "-X main.version="+v, "-o", filepath.Join(dir, "fn.wasm"), "./testdata/fn")
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			if out, err := cmd.CombinedOutput(); err != nil {
				fnErr = fmt.Errorf("building testdata/fn: %v\n%s", err, out)
				return
			}
			fnModules[v] = dir
		}
	})
	if fnErr != nil {
		t.Fatal(fnErr)
	}
	return fnModules[version]
}

// functionRule is a rule whose triggers are the ConfigMaps labelled
// fn=trigger, each with the children testdata/fn (in dir) returns.
func (h *harness) functionRule(dir, rollout string, serve bool) *rules.Set {
	h.t.Helper()
	return h.loadRulesAt(filepath.Join(dir, "rules.yaml"), fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: fn}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: fn=trigger}
  rollout: {%s}
  resources:
    - id: items
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      function: {wasm: fn.wasm, timeout: 10s, serve: %v}
`, rollout, serve), func(l *rules.Loader) { l.SetFunctionMemory(64 << 20) })
}

// TestFunctionChildren: a function's children are applied, updated and
// pruned as a template's; a module (served: instances kept between
// calls) that loops, allocates without bound, panics, returns a kind its
// resource does not list, writes no children or a child without a name
// fails its trigger alone, while the others converge; a new module
// (started afresh for each call) rolls out in steps, as a new revision of
// the rule.
//
// API server: server-side apply and pruning of a function's children,
// Events of the triggers that fail.
func TestFunctionChildren(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles a Go program to WebAssembly")
	}
	h := newHarness(t)
	h.alone = true                                             // its looping and allocating modules cost the process a core for seconds
	v1 := h.functionRule(fnModule(t, "v1"), "step: 50%", true) // served: instances kept between calls
	store := newMemRollouts(v1.Get("fn"))
	h.rollouts = store
	trigger := map[string]string{"fn": "trigger"}
	h.createCM("good", trigger, map[string]string{"items": "a,b"})
	for _, do := range []string{"loop", "alloc", "trap", "kind", "junk", "generate"} {
		h.createCM(do, trigger, map[string]string{"do": do})
	}
	h.start(v1)
	version := func(name string) string {
		cm, ok := h.configMap(h.ns, name)
		if !ok || cm.Labels[rules.LabelRule] != "fn" {
			return ""
		}
		return cm.Data["version"]
	}
	h.eventually("good's children a and b", func() bool { return version("good-a") == "v1" && version("good-b") == "v1" })
	for do, why := range map[string]string{
		"loop":     "ran longer than its time limit of 10s: stopped",
		"alloc":    "out of memory",
		"trap":     "exited with code 2 (stderr: panic: assignment to entry in nil map)",
		"kind":     "not among the kinds listed",
		"junk":     `returned no {"children": [objects]}`,
		"generate": "metadata.generateName: not supported",
	} {
		// 10 s a call: the race detector and a busy machine slow a
		// module's start (a Go module took over 1 s in CI).
		h.waitForFailedWithin(2*time.Minute, do, why)
	}

	// Updated and pruned as a template's children are.
	h.updateCM("good", func(cm *corev1.ConfigMap) { cm.Data["items"] = "a,c" })
	h.eventually("b pruned, c made", func() bool {
		_, b := h.configMap(h.ns, "good-b")
		return !b && version("good-c") == "v1" && version("good-a") == "v1"
	})

	// A new module is a new revision: it rolls out in steps of half the
	// triggers (the failing ones gone: a step with failing reconciles
	// does not complete).
	for _, do := range []string{"loop", "alloc", "trap", "kind", "junk", "generate"} {
		if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), do, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		h.createCM(fmt.Sprintf("more%d", i), trigger, map[string]string{"items": "x"})
	}
	h.eventually("the new triggers' children", func() bool {
		for i := range 4 {
			if version(fmt.Sprintf("more%d-x", i)) != "v1" {
				return false
			}
		}
		return true
	})
	v2 := h.functionRule(fnModule(t, "v2"), "step: 50%", false) // and a fresh start per call
	if v2.Get("fn").Hash == v1.Get("fn").Hash {
		t.Fatal("a new module left the rule's hash as it was")
	}
	if !strings.Contains(string(v2.Get("fn").Source), `"sha256":"`) {
		t.Errorf("the rule's source names no module digest: %s", v2.Get("fn").Source)
	}
	h.updates <- v2
	h.eventually("the rollout complete, every child from v2", func() bool {
		if rec := store.get("fn"); rec.State != rollout.Complete || rec.Steps != 2 {
			return false
		}
		for _, name := range []string{"good-a", "good-c", "more0-x", "more1-x", "more2-x", "more3-x"} {
			if version(name) != "v2" {
				return false
			}
		}
		return true
	})
}
