package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/reload"
)

// watchRules feeds the running engine from the rule files in dir, as `run`
// does. It returns the first set, to start the engine with.
func (h *harness) watchRules(dir string) *rules.Set {
	h.t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	src := reload.NewSource(l, []string{dir})
	first := src.Load()
	if len(first.Errors) > 0 {
		h.t.Fatalf("initial rule files: %v", first.Errors)
	}
	w := reload.NewWatcher(src, 50e6)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(ctx, func(st reload.Status) {
			select {
			case h.updates <- st.Set:
			case <-ctx.Done():
			}
		})
	}()
	h.t.Cleanup(func() { cancel(); <-done })
	<-w.Ready()
	return first.Set
}

func writeRule(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // as editors do
		t.Fatal(err)
	}
}

func labelRule(name, selector, value string) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "%s"}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-%s"}
        data: {value: "%s"}
`, name, selector, name, value)
}

// TestHotReload: a changed rule file replaces only its rule's loop; the
// others keep theirs.
//
// API server: live informers kept, replaced and stopped across reloads.
func TestHotReload(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	changing := filepath.Join(dir, "changing.yaml")
	steady := filepath.Join(dir, "steady.yaml")
	writeRule(t, changing, strings.ReplaceAll(labelRule("changing", "a", "v1"), "NS", h.ns))
	writeRule(t, steady, strings.ReplaceAll(labelRule("steady", "b", "s"), "NS", h.ns))
	h.start(h.watchRules(dir))

	h.createCM("t", map[string]string{"a": "1", "b": "1"}, nil)
	h.eventually("both rules' children", func() bool {
		c, ok := h.configMap(h.ns, "t-changing")
		_, s := h.configMap(h.ns, "t-steady")
		return ok && s && c.Data["value"] == "v1"
	})
	steadyCtl, steadyQueue := h.loop("steady"), h.loop("steady").queue
	informers := h.engine.Informers()

	// A changed rule takes effect while running.
	writeRule(t, changing, strings.ReplaceAll(labelRule("changing", "a", "v2"), "NS", h.ns))
	h.eventually("the changed rule's new template applied", func() bool {
		c, _ := h.configMap(h.ns, "t-changing")
		return c != nil && c.Data["value"] == "v2"
	})
	if h.loop("steady") != steadyCtl || h.loop("steady").queue != steadyQueue {
		t.Error("the unchanged rule's loop or queue was recreated by a reload")
	}
	if n := h.engine.Informers(); n != informers {
		t.Errorf("informers %d → %d across a reload that changed a template only", informers, n)
	}

	// A broken file keeps its last good version enforced.
	writeRule(t, changing, "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: changing}\nspec: {wen: x}\n")
	h.createCM("u", map[string]string{"a": "1"}, nil)
	h.eventually("the last good version of the broken rule to act on a new trigger", func() bool {
		c, ok := h.configMap(h.ns, "u-changing")
		return ok && c.Data["value"] == "v2"
	})

	// A removed rule stops and leaves its children.
	if err := os.Remove(changing); err != nil {
		t.Fatal(err)
	}
	h.eventually("the removed rule's loop to stop", func() bool {
		h.engine.set.mu.Lock()
		defer h.engine.set.mu.Unlock()
		_, running := h.engine.set.loops["changing"]
		return !running
	})
	h.createCM("w", map[string]string{"a": "1", "b": "1"}, nil)
	h.eventually("the steady rule to act on a new trigger", func() bool { _, ok := h.configMap(h.ns, "w-steady"); return ok })
	if _, ok := h.configMap(h.ns, "w-changing"); ok {
		t.Error("a removed rule still acts")
	}
	for _, name := range []string{"t-changing", "u-changing"} {
		if _, ok := h.configMap(h.ns, name); !ok {
			t.Errorf("removing a rule deleted its child %s", name)
		}
	}
	if h.loop("steady") != steadyCtl {
		t.Error("the unchanged rule was restarted when another rule was removed")
	}
}

// TestRemovedRuleMetrics: the metrics of a removed rule are dropped; those
// of a changed rule, which keeps running, are not.
//
// API server: live informers and workqueues stopped on removal.
func TestRemovedRuleMetrics(t *testing.T) {
	h := newHarness(t)
	m := &recordingMetrics{}
	h.metrics = m
	h.start(h.loadRules(labelRule("changed", "a", "x") + "---\n" + labelRule("removed", "b", "y")))
	h.engine.Enforce(t.Context(), h.loadRules(labelRule("changed", "a", "z")))
	h.eventually("the changed rule running", func() bool { return h.engine.Ready() })
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.removed) != 1 || m.removed[0] != "removed" {
		t.Errorf("RuleRemoved for %v, want only the removed rule", m.removed)
	}
}

// TestRetiredKindPruned: a rule changed to no longer make a kind of child
// has those children pruned (their kind is watched by the new controller
// just for that); its other children stay. A further change keeps it so.
//
// API server: deletes of children of a kind the changed rule no longer
// makes.
func TestRetiredKindPruned(t *testing.T) {
	h := newHarness(t)
	withAccount := labelRule("retire", "retire", "v1") + `    - id: account
      template: {apiVersion: v1, kind: ServiceAccount, metadata: {name: "${object.metadata.name}-sa"}}
`
	h.createCM("t", map[string]string{"retire": "yes"}, nil)
	h.start(h.loadRules(withAccount))
	sa := func() bool {
		_, err := h.cs.CoreV1().ServiceAccounts(h.ns).Get(t.Context(), "t-sa", metav1.GetOptions{})
		return err == nil
	}
	h.eventually("both children", func() bool { _, ok := h.configMap(h.ns, "t-retire"); return ok && sa() })
	cm, _ := h.configMap(h.ns, "t-retire")

	h.engine.Enforce(t.Context(), h.loadRules(labelRule("retire", "retire", "v2")))
	h.eventually("the ServiceAccount, a kind the rule no longer makes, to be pruned", func() bool { return !sa() })
	h.eventually("the ConfigMap child updated in place", func() bool {
		c, ok := h.configMap(h.ns, "t-retire")
		return ok && c.Data["value"] == "v2" && c.UID == cm.UID
	})
	if kinds := h.loop("retire").watches.retired; len(kinds) != 1 || kinds[0].Kind != "ServiceAccount" {
		t.Errorf("retired kinds %v, want ServiceAccount", kinds)
	}
	h.engine.Enforce(t.Context(), h.loadRules(labelRule("retire", "retire", "v3")))
	if kinds := h.loop("retire").watches.retired; len(kinds) != 1 || kinds[0].Kind != "ServiceAccount" {
		t.Errorf("after a further change, retired kinds %v, want ServiceAccount still", kinds)
	}
	h.eventually("the running rule", func() bool { return h.engine.Ready() })
}

// TestStatesDuringDrain: while a changed rule's loop drains a reconcile
// still writing, States, Ready, InForce, Progress and Rollouts answer —
// a rule change never holds /readyz or a scrape behind a reconcile — and
// report the stopping loop: it may still call its rule's functions. Once
// it has stopped, the new rule is the one in force.
//
// API server: a reconcile held in flight by a slow request.
func TestStatesDuringDrain(t *testing.T) {
	h := newHarness(t)
	held, unblock := h.holdApplies("slow-copy")
	defer unblock() // a failure below must not leave the drain held: deferred calls run before the harness stops
	old := h.loadRules(copyRule)
	h.start(old)
	h.createCM("slow", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the reconcile of slow never applied its child")
	}
	changed := h.loadRules(strings.Replace(copyRule, `"copy=yes"`, `"copy in (yes)"`, 1))
	enforced := make(chan struct{})
	go func() {
		defer close(enforced)
		h.engine.Enforce(t.Context(), changed)
	}()
	h.eventually("the old loop stopping", func() bool {
		h.engine.set.mu.Lock()
		defer h.engine.set.mu.Unlock()
		return len(h.engine.set.draining) == 1
	})
	type answer struct {
		states  []RuleState
		inForce []*rules.Rule
	}
	answered := make(chan answer, 1)
	go func() {
		a := answer{states: h.engine.States(), inForce: h.engine.InForce()}
		h.engine.Ready()
		h.engine.Progress()
		h.engine.Rollouts()
		answered <- a
	}()
	select {
	case a := <-answered:
		if len(a.states) != 1 || a.states[0].Rule != "copy" || a.states[0].State != StateRunning {
			t.Errorf("states while draining: %+v, want the stopping loop of copy, running", a.states)
		}
		if len(a.inForce) != 1 || a.inForce[0].Hash != old.Rules()[0].Hash {
			t.Errorf("in force while draining: %d rules, want the old version of copy", len(a.inForce))
		}
	case <-enforced:
		t.Fatal("Enforce returned while a reconcile of the old loop was writing")
	case <-time.After(30 * time.Second):
		t.Fatal("States and the rest waited for the drain")
	}
	select {
	case <-enforced:
		t.Fatal("Enforce returned while a reconcile of the old loop was writing")
	default:
	}
	unblock()
	select {
	case <-enforced:
	case <-time.After(30 * time.Second):
		t.Fatal("Enforce did not return once the reconcile finished")
	}
	if in := h.engine.InForce(); len(in) != 1 || in[0].Hash != changed.Rules()[0].Hash {
		t.Errorf("in force after the change: %d rules, want the new version of copy", len(in))
	}
}
