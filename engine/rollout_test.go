package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

// memRollouts is a RolloutStore in memory: what the manager keeps on
// revision objects, as a restarted engine would find it.
type memRollouts struct {
	mu      sync.Mutex
	recs    map[string]rollout.Record // by the hash of the revision rolled out to
	current map[string]string         // by rule: the revision of its rollout under way
	rules   map[string]*rules.Rule    // revisions by hash
	events  []string
	// removed are the last versions of rules removed, as their newest
	// revisions would hold them; removals what removing each did.
	removed  []*rules.Rule
	removals map[string]RemovalRecord
}

func newMemRollouts(revisions ...*rules.Rule) *memRollouts {
	m := &memRollouts{recs: map[string]rollout.Record{}, current: map[string]string{}, rules: map[string]*rules.Rule{}, removals: map[string]RemovalRecord{}}
	for _, r := range revisions {
		m.rules[r.Hash] = r
	}
	return m
}

func (m *memRollouts) Resume(_ context.Context, r *rules.Rule) (*rollout.Record, *rules.Rule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[r.Hash]
	if !ok || rec.State == rollout.Complete {
		return nil, nil, nil
	}
	return &rec, m.rules[rec.From], nil
}

func (m *memRollouts) Record(_ context.Context, r *rules.Rule, rec rollout.Record, eventType, reason, msg string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[r.Hash] = rec
	if rec.State != rollout.Superseded {
		m.current[r.Name] = r.Hash
	}
	m.events = append(m.events, eventType+" "+reason+": "+msg)
}

func (m *memRollouts) Fetch(_ context.Context, r *rules.Rule) (*rollout.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[r.Hash]
	if !ok {
		return nil, nil
	}
	return &rec, nil
}

func (m *memRollouts) Removed(_ context.Context, set *rules.Set) ([]*rules.Rule, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*rules.Rule
	for _, r := range m.removed {
		_, recorded := m.removals[r.Name]
		if set.Get(r.Name) == nil && !recorded && (r.RemovalPolicy == rules.DeletionDelete || r.OrdersTeardown()) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *memRollouts) RecordRemoval(_ context.Context, r *rules.Rule, rec RemovalRecord, eventType, reason, msg string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.removals[r.Name] = rec
	m.events = append(m.events, eventType+" "+reason+": "+msg)
}

// removal is what removing rule did, if recorded.
func (m *memRollouts) removal(rule string) (RemovalRecord, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.removals[rule]
	return rec, ok
}

func (m *memRollouts) get(rule string) rollout.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recs[m.current[rule]]
}

// of is the record on the revision of hash.
func (m *memRollouts) of(hash string) rollout.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.recs[hash]
}

func (m *memRollouts) said(reason string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.events {
		if strings.Contains(e, " "+reason+": ") {
			out = append(out, e)
		}
	}
	return out
}

// rolloutRule is a rule whose triggers are the ConfigMaps labelled
// rollout=trigger, each with one child holding version; with ready, the
// child is ready once the test annotates it test/ready: <version>.
func rolloutRule(version string, ready bool, rollout, extra string) string {
	readyWhen := ""
	if ready {
		readyWhen = fmt.Sprintf(`
      readyWhen: ["self.metadata.?annotations[?'test/ready'].orValue('') == '%s'"]`, version)
	}
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: roll}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "rollout=trigger"}
  rollout: {%s}
%s  resources:
    - id: child%s
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-child"}
        data: {version: "%s"}
`, rollout, extra, readyWhen, version)
}

// createTriggers creates n trigger ConfigMaps, a few at a time.
func (h *harness) createTriggers(n int) {
	h.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("t%03d", i), Labels: map[string]string{"rollout": "trigger"}}}, metav1.CreateOptions{})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		h.t.Fatal(err)
	}
}

// childVersions counts the children by the version they hold, and lists
// the names of those at version v.
func (h *harness) childVersions(v string) (map[string]int, []string) {
	h.t.Helper()
	list, err := h.cs.CoreV1().ConfigMaps(h.ns).List(context.Background(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=roll"})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]int{}
	var at []string
	for _, cm := range list.Items {
		out[cm.Data["version"]]++
		if cm.Data["version"] == v {
			at = append(at, cm.Name)
		}
	}
	return out, at
}

// markReady annotates children test/ready: v.
func (h *harness) markReady(v string, names []string) {
	h.t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test/ready":%q}}}`, v)
	for _, name := range names {
		if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
}

// startRollouts runs an engine with a rollout store in memory over n
// triggers of rolloutRule at v1, and waits until every child is made.
func startRollouts(t *testing.T, n int) (*harness, *memRollouts, *rules.Set) {
	t.Helper()
	h := newHarness(t)
	v1 := h.loadRules(rolloutRule("v1", false, "", ""))
	store := newMemRollouts(v1.Get("roll"))
	h.rollouts = store
	h.createTriggers(n)
	h.start(v1)
	h.eventually(fmt.Sprintf("%d children at v1", n), func() bool { c, _ := h.childVersions("v1"); return c["v1"] == n })
	return h, store, v1
}

// TestRolloutSteps: 500 triggers; a change moves 50, waits until their
// children are ready, then moves the next 50; a step with a child never
// ready halts the rollout when its deadline passes, the rest untouched; a
// trigger created meanwhile gets the new revision; an engine started
// again continues from the step it had reached.
//
// API server: readiness read from live children, across two revisions'
// applies.
func TestRolloutSteps(t *testing.T) {
	h, store, _ := startRollouts(t, 500)
	h.updates <- h.loadRules(rolloutRule("v2", true, "progressDeadline: 1h", ""))
	moved := func(want int) []string {
		t.Helper()
		var at []string
		h.eventually(fmt.Sprintf("%d children at v2", want), func() bool {
			var n map[string]int
			n, at = h.childVersions("v2")
			return n["v2"] == want && n["v1"] == 500-want
		})
		return at
	}
	step1 := moved(50)
	if rec := store.get("roll"); rec.State != rollout.Progressing || rec.Step != 1 || rec.Steps != 10 || rec.Moved != 50 || rec.Total != 500 {
		t.Fatalf("after step 1: %+v", rec)
	}
	// Nothing more moves while the step's children are not ready.
	h.eventually("the loop to be idle", func() bool { return h.loop("roll").idle() })
	if n, _ := h.childVersions("v2"); n["v2"] != 50 {
		t.Fatalf("a step not ready moved on: %v", n)
	}
	h.markReady("v2", step1)
	step2 := moved(100)
	h.markReady("v2", step2)
	step3 := moved(150)

	// One child of step 3 never becomes ready; a shorter deadline (a
	// setting, not a new revision) fails the step.
	var rest []string
	for _, name := range step3 {
		if !slices.Contains(step1, name) && !slices.Contains(step2, name) {
			rest = append(rest, name)
		}
	}
	if len(rest) != 50 {
		t.Fatalf("step 3 moved %d triggers, want 50", len(rest))
	}
	h.markReady("v2", rest[1:])
	h.updates <- h.loadRules(rolloutRule("v2", true, "progressDeadline: 2s", ""))
	h.eventually("the rollout to halt", func() bool { return store.get("roll").State == rollout.Halted })
	rec := store.get("roll")
	bad := strings.TrimSuffix(rest[0], "-child")
	if rec.Reason != rollout.ReasonStepFailed || rec.Step != 3 || !strings.Contains(rec.Message, h.ns+"/"+bad) || !strings.Contains(rec.Message, `resource "child" is not ready`) {
		t.Fatalf("halted: %+v", rec)
	}
	if said := store.said("RolloutHalted"); len(said) != 1 || !strings.HasPrefix(said[0], "Warning ") {
		t.Fatalf("halt events: %q", said)
	}
	if n, _ := h.childVersions("v2"); n["v2"] != 150 || n["v1"] != 350 {
		t.Fatalf("after the halt: %v", n)
	}
	st := h.engine.Rollouts()
	if len(st) != 1 || st[0].OnTo != 150 || st[0].OnFrom != 350 || st[0].State != rollout.Halted {
		t.Fatalf("Rollouts: %+v", st)
	}

	// Drift on a trigger not moved is repaired by the revision it is on.
	var stay string
	for i := range 500 {
		if name := fmt.Sprintf("t%03d-child", i); !slices.Contains(step3, name) {
			stay = name
			break
		}
	}
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), stay, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the deleted child back at v1", func() bool {
		cm, ok := h.configMap(h.ns, stay)
		return ok && cm.Data["version"] == "v1"
	})

	// A trigger created during the rollout gets the new revision.
	h.createCM("late", map[string]string{"rollout": "trigger"}, nil)
	h.eventually("the new trigger's child at v2", func() bool {
		cm, ok := h.configMap(h.ns, "late-child")
		return ok && cm.Data["version"] == "v2"
	})

	// Started again, the engine resumes the halted rollout where it was.
	h.stop()
	h.start(h.loadRules(rolloutRule("v2", true, "progressDeadline: 2s", "")))
	h.eventually("the rollout resumed", func() bool { return len(h.engine.Rollouts()) == 1 })
	if st := h.engine.Rollouts(); st[0].OnTo != 151 || st[0].State != rollout.Halted || st[0].Step != 3 {
		t.Fatalf("resumed: %+v", st[0])
	}
	// A fix of the bad child, and settings that change, let it go on;
	// the rollout completes once every step is ready.
	h.markReady("v2", rest[:1])
	h.updates <- h.loadRules(rolloutRule("v2", true, "progressDeadline: 1h, step: 50%", ""))
	h.eventually("the rollout to move on", func() bool { n, _ := h.childVersions("v2"); return n["v2"] > 150 })
	h.eventuallyWithin(60*time.Second, "the rollout complete", func() bool {
		_, at := h.childVersions("v2")
		h.markReady("v2", at)
		return store.get("roll").State == rollout.Complete
	})
	if n, _ := h.childVersions("v2"); n["v2"] != 501 {
		t.Fatalf("complete: %v", n)
	}
}

// TestRolloutRollback: a step that fails under onFailure: Rollback sends
// its triggers back to the previous revision's children.
//
// API server: server-side apply moving children back between revisions.
func TestRolloutRollback(t *testing.T) {
	h, store, v1 := startRollouts(t, 40)
	v2 := h.loadRules(rolloutRule("v2", true, "step: 4, progressDeadline: 2s, onFailure: Rollback", ""))
	h.updates <- v2
	h.eventually("the rollout rolled back", func() bool { return store.get("roll").State == rollout.RolledBack })
	if rec := store.get("roll"); rec.Step != 1 || rec.Moved != 4 {
		t.Fatalf("rolled back: %+v", rec)
	}
	// Both revisions are in force: the triggers are back on v1 (the
	// modules their functions call are kept).
	if got, want := inForce(h), []string{v1.Get("roll").Hash, v2.Get("roll").Hash}; !slices.Equal(got, sorted(want)) {
		t.Errorf("rules in force %v, want v1's and v2's %v", got, sorted(want))
	}
	h.eventually("every child back at v1", func() bool { n, _ := h.childVersions("v1"); return n["v1"] == 40 })
	if said := store.said("RolloutRolledBack"); len(said) != 1 || !strings.Contains(said[0], "4 triggers go back") {
		t.Fatalf("events: %q", said)
	}
	// New triggers come on the revision rolled back to.
	h.createCM("late", map[string]string{"rollout": "trigger"}, nil)
	h.eventually("the new trigger's child at v1", func() bool {
		cm, ok := h.configMap(h.ns, "late-child")
		return ok && cm.Data["version"] == "v1"
	})
}

// TestRolloutPruneBudget: a change whose when is false for every trigger
// removes at most maxPrunes of the children, halts and says how many it
// would remove in all; raising maxPrunes lets it finish.
//
// API server: deletes counted against maxPrunes on live children.
func TestRolloutPruneBudget(t *testing.T) {
	h, store, _ := startRollouts(t, 100)
	off := "  when: \"object.metadata.name == 'none'\"\n"
	h.updates <- h.loadRules(rolloutRule("v1", false, "", off))
	h.eventually("the rollout to halt", func() bool { return store.get("roll").State == rollout.Halted })
	rec := store.get("roll")
	if rec.Reason != rollout.ReasonPruneBudget || rec.Pruned != 10 || !strings.Contains(rec.Message, "removes 100 of the rule's 100 children in all (10 so far)") {
		t.Fatalf("halted: %+v", rec)
	}
	h.eventually("10 children pruned", func() bool { n, _ := h.childVersions("v1"); return n["v1"] == 90 })
	h.eventually("the loop to be idle", func() bool { return h.loop("roll").idle() })
	if n, _ := h.childVersions("v1"); n["v1"] != 90 {
		t.Fatalf("pruned past the budget: %v", n)
	}
	if got := inForce(h); len(got) != 2 {
		t.Errorf("halted mid-rollout, rules in force %v: want both revisions", got)
	}
	last := h.loadRules(rolloutRule("v1", false, "maxPrunes: 100%", off))
	h.updates <- last
	h.eventually("every child pruned", func() bool { n, _ := h.childVersions("v1"); return n["v1"] == 0 })
	h.eventually("the rollout complete", func() bool { return store.get("roll").State == rollout.Complete })
	if got := inForce(h); !slices.Equal(got, []string{last.Get("roll").Hash}) {
		t.Errorf("the rollout complete, rules in force %v: want only the newest, %s", got, last.Get("roll").Hash)
	}
}

// inForce are the hashes of the rules h's engine runs (Engine.InForce),
// sorted.
func inForce(h *harness) []string {
	var out []string
	for _, r := range h.engine.InForce() {
		out = append(out, r.Hash)
	}
	return sorted(out)
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestRolloutImmediate: strategy Immediate moves every trigger at once.
//
// API server: applies of a changed rule on live children.
func TestRolloutImmediate(t *testing.T) {
	h := newHarness(t)
	store := newMemRollouts()
	h.rollouts = store
	h.createTriggers(30)
	h.start(h.loadRules(rolloutRule("v1", false, "", "")))
	h.eventually("30 children at v1", func() bool { n, _ := h.childVersions("v1"); return n["v1"] == 30 })
	h.updates <- h.loadRules(rolloutRule("v2", true, "strategy: Immediate", ""))
	h.eventually("30 children at v2", func() bool { n, _ := h.childVersions("v2"); return n["v2"] == 30 })
	if len(h.engine.Rollouts()) != 0 || len(store.said("RolloutStep")) != 0 {
		t.Fatalf("an Immediate change rolled out: %+v", h.engine.Rollouts())
	}
}

// TestRolloutSuperseded: a rule that changes again mid-rollout rolls the
// newest revision out from the one the unmoved triggers are on, the
// triggers moved so far going to the newest at once; the previous text
// put back moves every trigger back to it at once.
//
// API server: applies of three revisions on live children.
func TestRolloutSuperseded(t *testing.T) {
	h, store, v1 := startRollouts(t, 100)

	v2 := h.loadRules(rolloutRule("v2", true, "progressDeadline: 1h", ""))
	h.updates <- v2
	var step1 []string
	h.eventually("step 1 of v2", func() bool {
		var n map[string]int
		n, step1 = h.childVersions("v2")
		return n["v2"] == 10 && n["v1"] == 90
	})

	v3 := h.loadRules(rolloutRule("v3", true, "progressDeadline: 1h", ""))
	h.updates <- v3
	h.eventually("v2's 10 and a first step of 10 at v3, the rest at v1", func() bool {
		n, _ := h.childVersions("")
		return n["v3"] == 20 && n["v1"] == 80 && n["v2"] == 0
	})
	_, at3 := h.childVersions("v3")
	for _, name := range step1 {
		if !slices.Contains(at3, name) {
			t.Errorf("%s, moved to v2, is not at v3", name)
		}
	}
	rec := store.get("roll")
	if rec.From != v1.Get("roll").Hash || rec.To != v3.Get("roll").Hash || rec.Step != 1 || rec.Moved != 20 || rec.Steps != 9 {
		t.Errorf("the rollout to v3: %+v", rec)
	}
	h.eventually("v2's rollout superseded", func() bool { return store.of(v2.Get("roll").Hash).State == rollout.Superseded })

	// v1 put back: every trigger is on it at once.
	h.updates <- h.loadRules(rolloutRule("v1", false, "", ""))
	h.eventually("every child back at v1", func() bool { n, _ := h.childVersions(""); return n["v1"] == 100 })
	if st := h.engine.Rollouts(); len(st) != 0 {
		t.Errorf("putting v1 back rolled out: %+v", st)
	}
}
