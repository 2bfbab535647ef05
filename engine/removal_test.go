package engine

import (
	"slices"
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules"
)

// removedRule gives each ConfigMap labelled LABEL a chain of two
// children, a kept child that reads the first (so its teardown is
// ordered), and a note left behind (deletionPolicy: Orphan). SETTINGS
// are its removalPolicy and rollout.
const removedRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: NAME}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: LABEL}
  teardown: Ordered
SETTINGS
  resources:
    - id: first
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-first"}
    - id: second
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-second"}
        data: {first: "${children.first.metadata.name}"}
    - id: note
      deletionPolicy: Orphan
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-note"}
`

func removedRuleOf(name, label, settings string) string {
	return strings.NewReplacer("NAME", name, "LABEL", label, "SETTINGS", settings).Replace(removedRule)
}

// TestRuleRemoval: a rule with removalPolicy: Delete removed while
// syncloop was down is removed at the next start — its triggers lose the
// teardown finalizer, its children are deleted but for those it orphans,
// and the removal is recorded, once. One removed while syncloop runs
// whose children are more than its maxPrunes halts: it deletes none and
// says why, while the finalizer still comes off its triggers. A rule
// that orphans its children on removal (the default) leaves them all.
//
// API server: finalizers on triggers, and deletes with preconditions.
func TestRuleRemoval(t *testing.T) {
	h := newHarness(t)
	h.limitNS = h.ns // a removal lists the rule's kinds where the engine works: here, not the other tests' namespaces
	store := newMemRollouts()
	h.rollouts = store
	doc := removedRuleOf("gone", "gone", "  removalPolicy: Delete\n  rollout: {maxPrunes: 100%}") + "---\n" +
		removedRuleOf("halts", "halts", "  removalPolicy: Delete") + "---\n" +
		removedRuleOf("stays", "stays", "")
	all := h.loadRules(doc)
	store.removed = all.Rules()
	h.start(all)
	for _, name := range []string{"gone", "halts", "stays"} {
		h.createCM(name+"-t", map[string]string{name: "yes"}, nil)
	}
	held := func(name string) bool {
		cm, _ := h.configMap(h.ns, name+"-t")
		return slices.Contains(cm.Finalizers, "teardown.syncloop.dev/"+name)
	}
	h.eventually("every trigger's children, and the triggers held", func() bool {
		for _, name := range []string{"gone", "halts", "stays"} {
			if _, ok := h.configMap(h.ns, name+"-t-note"); !ok || !held(name) {
				return false
			}
		}
		return true
	})

	// gone is removed while syncloop is down.
	h.stop()
	h.start(all.Only(func(r *rules.Rule) bool { return r.Name != "gone" }))
	h.eventually("gone's removal recorded", func() bool { _, ok := store.removal("gone"); return ok })
	if rec, _ := store.removal("gone"); rec.State != RemovalDone || rec.Deleted != 2 || rec.Released != 1 || rec.Children != 2 {
		t.Errorf("gone's removal %+v, want Removed, 2 of 2 children deleted, 1 trigger released", rec)
	}
	for _, child := range []string{"gone-t-first", "gone-t-second"} {
		if _, ok := h.configMap(h.ns, child); ok {
			t.Errorf("%s stays after its rule's removal", child)
		}
	}
	if _, ok := h.configMap(h.ns, "gone-t-note"); !ok {
		t.Error("the child its rule orphans was deleted")
	}
	if held("gone") {
		t.Error("gone's trigger keeps the finalizer of a removed rule")
	}

	// halts and stays are removed while syncloop runs.
	empty, err := rules.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	h.updates <- empty
	h.eventually("halts's removal recorded", func() bool { _, ok := store.removal("halts"); return ok })
	rec, _ := store.removal("halts")
	if rec.State != RemovalHalted || rec.Deleted != 0 || rec.Children != 2 || !strings.Contains(rec.Message, "more than rollout.maxPrunes (10%, 1)") {
		t.Errorf("halts's removal %+v, want Halted with none of its 2 children deleted, beyond maxPrunes", rec)
	}
	h.eventually("the finalizers off the triggers of the removed rules", func() bool { return !held("halts") && !held("stays") })
	for _, child := range []string{"halts-t-first", "halts-t-second", "stays-t-first", "stays-t-second"} {
		if _, ok := h.configMap(h.ns, child); !ok {
			t.Errorf("%s was deleted by a removal that halted, or that orphans", child)
		}
	}
	if _, ok := store.removal("gone"); !ok || len(store.events) == 0 {
		t.Errorf("events %v", store.events)
	}
}
