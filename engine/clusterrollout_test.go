package engine

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

// stagedRule: every Widget in NS gets a copy of
// generation GEN in namespace default of every cluster; a copy is ready
// once someone there approved its generation (annotation approved). A
// change reaches the canary cluster first, then the others.
const stagedRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: staged}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  rollout:
    progressDeadline: 3s
    clusters:
      - selector: "cluster.labels.?tier.orValue('') == 'canary'"
  resources:
    - id: copy
      clusters: {selector: "true"}
      readyWhen: ["self.metadata.?annotations[?'approved'].orValue('') == self.data.gen"]
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-staged", namespace: default}
        data: {gen: "GEN"}
  status:
    clusters: ${clusters}
`

// stagedGen is the generation of trigger name's copy in w ("": none).
func stagedGen(w *workload, name string) string {
	cm, err := w.cs.CoreV1().ConfigMaps("default").Get(context.Background(), name+"-staged", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data["gen"]
}

// approve approves generation gen of trigger name's copy in w, as a
// health check there would.
func (h *harness) approve(w *workload, name, gen string) {
	h.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"approved":%q}}}`, gen)
	if _, err := w.cs.CoreV1().ConfigMaps("default").Patch(h.t.Context(), name+"-staged", types.MergePatchType, []byte(patch),
		metav1.PatchOptions{FieldManager: "health-check"}); err != nil {
		h.t.Fatal(err)
	}
}

// TestFleetRollout: a change of a rule that steps by cluster reaches the
// canary cluster first, every trigger at once, while the other cluster
// keeps the children the previous revision made — status.clusters says
// RolloutPending there — and reaches it once the canary's children are
// ready; a change whose canary children never get ready halts there, and
// the other cluster keeps the last good generation.
//
// API server: three control planes (syncloop's own, canary, main).
func TestFleetRollout(t *testing.T) {
	h := newHarness(t)
	ws := startWorkloads(t, "canary", "main")
	canary, main := ws[0], ws[1]
	h.runInventory(false)
	h.installWidgets()
	h.putCluster(canary, map[string]string{"tier": "canary"})
	h.putCluster(main, nil)
	gen := func(g string) *rules.Set {
		return h.loadRules(strings.Replace(stagedRule, "GEN", g, 1))
	}
	h.start(gen("1"))
	names := []string{"s0", "s1", "s2"}
	for _, name := range names {
		h.createWidget(name, map[string]any{})
	}
	everywhere := func(g string) func() bool {
		return func() bool {
			for _, name := range names {
				for _, w := range ws {
					if stagedGen(w, name) != g {
						return false
					}
				}
			}
			return true
		}
	}
	h.eventually("generation 1 in both clusters (a first version: no rollout)", everywhere("1"))
	approveAll := func(w *workload, g string) {
		for _, name := range names {
			h.approve(w, name, g)
		}
	}
	approveAll(canary, "1")
	approveAll(main, "1")

	h.updates <- gen("2")
	h.eventually("generation 2 in the canary cluster", func() bool {
		for _, name := range names {
			if stagedGen(canary, name) != "2" {
				return false
			}
		}
		return true
	})
	st := h.engine.Rollouts()
	if len(st) != 1 || st[0].Step != 1 || st[0].Steps != 2 || st[0].State != rollout.Progressing {
		t.Fatalf("rollout %+v, want step 1 of 2 under way", st)
	}
	for _, name := range names {
		if g := stagedGen(main, name); g != "1" {
			t.Fatalf("%s's copy in cluster main is at generation %q before the canary's children are ready", name, g)
		}
	}
	if !h.within(30*time.Second, func() bool {
		s0 := h.widget("s0")
		c := readyCondition(s0)
		clusters, _, _ := unstructured.NestedSlice(s0.Object, "status", "clusters")
		return c != nil && c["reason"] == "WaitingForCopy" && strings.Contains(fmt.Sprint(c["message"]), "approved") &&
			fmt.Sprint(clusterStates(clusters)) == "[canary:false:ChildrenNotReady main:false:RolloutPending]"
	}) {
		t.Fatalf("s0's status does not say what waits where: %v", h.widget("s0").Object["status"])
	}
	approveAll(canary, "2")
	h.eventually("generation 2 in cluster main once the canary's children are ready", everywhere("2"))
	approveAll(main, "2")
	h.eventually("the rollout to complete", func() bool {
		st := h.engine.Rollouts()
		return len(st) == 1 && st[0].State == rollout.Complete && st[0].Step == 2
	})

	// A generation whose canary children never get ready halts at the
	// canary: main keeps generation 2.
	h.updates <- gen("3")
	h.eventuallyWithin(30*time.Second, "the rollout of generation 3 to halt at its first step", func() bool {
		st := h.engine.Rollouts()
		return len(st) == 1 && st[0].State == rollout.Halted && st[0].Step == 1 && strings.Contains(st[0].Message, "approved")
	})
	for _, name := range names {
		if g, m := stagedGen(canary, name), stagedGen(main, name); g != "3" || m != "2" {
			t.Fatalf("%s's copies after the halt: canary %q, main %q; want 3 and 2", name, g, m)
		}
	}
	// Halted, main's children stay as generation 2 made them — and a
	// trigger made meanwhile gets its copy in the canary alone.
	h.createWidget("late", map[string]any{})
	h.eventually("the late trigger's copy in the canary", func() bool { return stagedGen(canary, "late") == "3" })
	if g := stagedGen(main, "late"); g != "" {
		t.Fatalf("the late trigger's copy reached cluster main (generation %q) while the rollout is halted at the canary", g)
	}
	h.approve(canary, "late", "3")
	h.eventually("the late trigger's Ready to say the rollout has not reached main", func() bool {
		c := readyCondition(h.widget("late"))
		return c != nil && c["status"] == "False" && c["reason"] == "RolloutPending" && strings.Contains(fmt.Sprint(c["message"]), `"main"`)
	})
	if g := stagedGen(main, "s0"); g != "2" {
		t.Fatalf("s0's copy in cluster main is at generation %q, want 2 while halted", g)
	}

	// A change that would remove every copy, in every cluster, is more
	// than maxPrunes (10%) allows: it halts before its first step, and
	// nothing is removed anywhere.
	h.updates <- h.loadRules(strings.NewReplacer("id: copy", "id: renamed", "-staged", "-renamed", "GEN", "4").Replace(stagedRule))
	if !h.within(30*time.Second, func() bool {
		st := h.engine.Rollouts()
		return len(st) == 1 && st[0].State == rollout.Halted && st[0].Reason == rollout.ReasonPruneBudget && st[0].Step == 0 &&
			strings.Contains(st[0].Message, "removes 7 of the rule's 7 children") // s0–s2 in both clusters, late in the canary
	}) {
		t.Fatalf("the change that removes every copy did not halt: %+v", h.engine.Rollouts())
	}
	for _, name := range names {
		for _, w := range ws {
			if stagedGen(w, name) == "" {
				t.Fatalf("%s's copy in cluster %s was removed by a change that halted for its prunes", name, w.name)
			}
		}
	}
}
