package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/syncloop/syncloop/rules"
)

// rolloutRules is a rule over the ConfigMaps labelled rollout=trigger in
// NS, one child each holding VERSION; READY, when set, is the version the
// child's test/ready annotation must hold for it to be ready.
const rolloutRules = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: roll}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: rollout=trigger}
  rollout: {ROLLOUT}
  resources:
    - id: child
      readyWhen: ["READY == '' || self.metadata.?annotations[?'test/ready'].orValue('') == READY"]
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-child"}
        data: {version: VERSION}
`

func rolloutRuleFile(ns, version, ready, rollout string) string {
	return strings.NewReplacer("NS", ns, "VERSION", version, "READY", "'"+ready+"'", "ROLLOUT", rollout).Replace(rolloutRules)
}

// TestRolloutAcrossRestart: a rule change rolls out in steps recorded on
// its revision object — annotation, Events — and in /readyz, the metrics
// and rollout status; syncloop killed mid-way and started again continues
// from the step it had reached; a step that fails halts it, said on the
// revision.
func TestRolloutAcrossRestart(t *testing.T) {
	env, cs, _ := clients(t)
	ns := newNamespace(t, cs, "rollout")
	cms := cs.CoreV1().ConfigMaps(ns)
	dir := t.TempDir()
	writeFile(t, dir, "rules.yaml", rolloutRuleFile(ns, "v1", "", ""))
	createRolloutTriggers(t, cms, 100)
	children := func(version string) []string { t.Helper(); return childrenAt(t, cms, version) }
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 60*time.Second, what, cond) }
	metrics, probes := freeAddr(t), freeAddr(t)
	start := func(name string) *exec.Cmd {
		return syncloopProcess(t, name, "run", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
			"--metrics-bind-address", metrics, "--health-probe-bind-address", probes)
	}
	first := start("first")
	poll("100 children at v1", func() bool { return len(children("v1")) == 100 })

	// plan shows the change's first step, and how many follow.
	v2 := writeFile(t, t.TempDir(), "rules.yaml", rolloutRuleFile(ns, "v2", "v2", "progressDeadline: 1h"))
	code, out, errOut := syncloop(t, "plan", "-f", v2, "--kubeconfig", env.Kubeconfig(), "--syncloop-namespace", ns)
	if code != 2 || !strings.Contains(out, "Rollout of rule roll to revision ") ||
		!strings.Contains(out, ": step 1 of 10, 10 of 100 triggers on it (planned below); 9 steps follow, each once the one before is healthy.") ||
		!strings.Contains(out, "Plan: 0 to create, 10 to update, 0 to delete") {
		t.Errorf("plan: exit %d\n%s%s", code, out, errOut)
	}
	if len(children("v2")) != 0 {
		t.Fatal("plan wrote")
	}
	// A change that would remove every child: plan says the rollout halts
	// before its first step, and how much it would remove.
	off := strings.Replace(rolloutRuleFile(ns, "v1", "", "maxPrunes: 5"), "  rollout:", "  when: \"false\"\n  rollout:", 1)
	code, out, errOut = syncloop(t, "plan", "-f", writeFile(t, t.TempDir(), "rules.yaml", off), "--kubeconfig", env.Kubeconfig(), "--syncloop-namespace", ns)
	if code != 0 || !strings.Contains(out, ": Halted at step 0 of 0, 0 of 100 triggers on it: the change removes 100 of the rule's 100 children in all (0 so far), more than maxPrunes 5 allows (5)") ||
		!strings.Contains(out, "Plan: 0 to create, 0 to update, 0 to delete") {
		t.Errorf("plan of a removal: exit %d\n%s%s", code, out, errOut)
	}

	writeFile(t, dir, "rules.yaml", rolloutRuleFile(ns, "v2", "v2", "progressDeadline: 1h"))
	atV2 := func(n int) []string {
		t.Helper()
		var got []string
		poll(fmt.Sprintf("%d children at v2", n), func() bool { got = children("v2"); return len(got) == n && len(children("v1")) == 100-n })
		return got
	}
	step1 := atV2(10)
	rec := revisionRollout(t, cs, ns)
	if rec.State != "Progressing" || rec.Step != 1 || rec.Steps != 10 || rec.Moved != 10 {
		t.Fatalf("recorded after step 1: %+v", rec)
	}
	markReady(t, cms, "v2", step1)
	step2 := atV2(20)
	poll("step 2 recorded", func() bool { return revisionRollout(t, cs, ns).Step == 2 })

	// Killed in step 2; the restarted process continues it.
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	start("second")
	poll("the rollout resumed in /readyz", func() bool {
		return strings.Contains(httpGet("http://"+probes+"/readyz"), "rollout roll: Progressing, step 2 of 10, 20 triggers on revision")
	})
	if got := children("v2"); len(got) != 20 {
		t.Fatalf("after the restart %d children at v2, want the 20 of step 2", len(got))
	}
	markReady(t, cms, "v2", step2)
	step3 := atV2(30)
	if m := httpGet("http://" + metrics + "/metrics"); !strings.Contains(m, `syncloop_rollout_step{rule="roll"} 3`) ||
		!strings.Contains(m, `syncloop_rollout_state{rule="roll",state="Progressing"} 1`) || !strings.Contains(m, `role="to",rule="roll"} 30`) {
		t.Errorf("rollout metrics:\n%s", grepLines(m, "syncloop_rollout_"))
	}
	code, out, errOut = syncloop(t, "rollout", "status", "roll", "-n", ns, "--kubeconfig", env.Kubeconfig())
	if code != 0 || !strings.Contains(out, "Progressing: step 3 of 10, 30 of 100 triggers moved") {
		t.Errorf("rollout status: exit %d\n%s%s", code, out, errOut)
	}

	// One child of step 3 never ready, and a deadline shortened (a
	// setting: the same revision) halt the rollout.
	var fresh []string
	for _, n := range step3 {
		if !slices.Contains(step2, n) {
			fresh = append(fresh, n)
		}
	}
	markReady(t, cms, "v2", fresh[1:])
	writeFile(t, dir, "rules.yaml", rolloutRuleFile(ns, "v2", "v2", "progressDeadline: 2s"))
	poll("the rollout halted", func() bool { return revisionRollout(t, cs, ns).State == "Halted" })
	bad := ns + "/" + strings.TrimSuffix(fresh[0], "-child")
	if rec := revisionRollout(t, cs, ns); rec.Reason != "StepFailed" || !strings.Contains(rec.Message, bad) {
		t.Errorf("halted: %+v", rec)
	}
	var events []string
	poll("the halt's Event on the revision", func() bool {
		events = revisionEvents(t, cs, ns)
		return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, "Warning RolloutHalted") && strings.Contains(e, bad) })
	})
	if !slices.ContainsFunc(events, func(e string) bool {
		return strings.HasPrefix(e, "Normal RolloutStep") && strings.Contains(e, "step 1 of 10")
	}) {
		t.Errorf("events on the revision: %q", events)
	}
	if got := children("v2"); len(got) != 30 {
		t.Errorf("after the halt %d children at v2, want 30", len(got))
	}
	code, out, _ = syncloop(t, "rollout", "status", "roll", "-n", ns, "-o", "json", "--kubeconfig", env.Kubeconfig())
	var doc struct {
		Revisions []struct {
			Newest  bool
			Rollout *struct{ State, Reason string }
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Revisions) != 2 || doc.Revisions[0].Rollout == nil ||
		doc.Revisions[0].Rollout.State != "Halted" || doc.Revisions[0].Rollout.Reason != "StepFailed" {
		t.Errorf("rollout status -o json: exit %d, %v\n%s", code, err, out)
	}
}

// revisionRollout is the rollout recorded on rule roll's newest revision.
func revisionRollout(t *testing.T, cs kubernetes.Interface, ns string) (rec struct {
	State, Reason, Message string
	Step, Steps, Moved     int
}) {
	t.Helper()
	list, err := cs.AppsV1().ControllerRevisions(ns).List(context.Background(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=roll"})
	if err != nil {
		t.Fatal(err)
	}
	var newest int64
	for _, cr := range list.Items {
		if cr.Revision > newest {
			newest = cr.Revision
			rec.State = ""
			if s := cr.Annotations["syncloop.dev/rollout"]; s != "" {
				if err := json.Unmarshal([]byte(s), &rec); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return rec
}

// revisionEvents are the Events on rule roll's revisions, "type reason:
// message".
func revisionEvents(t *testing.T, cs kubernetes.Interface, ns string) []string {
	t.Helper()
	list, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.kind=ControllerRevision"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Type+" "+e.Reason+": "+e.Message)
	}
	return out
}

func markReady(t *testing.T, cms typedcorev1.ConfigMapInterface, version string, names []string) {
	t.Helper()
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{"test/ready":%q}}}`, version)
	for _, n := range names {
		if _, err := cms.Patch(context.Background(), n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRolloutLeaderHandover: the leader stops mid-rollout; the replica
// that takes over continues the rollout from the step it had reached.
func TestRolloutLeaderHandover(t *testing.T) {
	env, cs, _ := clients(t)
	ns := newNamespace(t, cs, "rollout-le")
	cms := cs.CoreV1().ConfigMaps(ns)
	rulesPath := writeFile(t, t.TempDir(), "rules.yaml", rolloutRuleFile(ns, "v1", "", ""))
	createRolloutTriggers(t, cms, 40)
	atVersion := func(version string) []string { return childrenAt(t, cms, version) }
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 60*time.Second, what, cond) }
	holder := func() string {
		l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "syncloop-test", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	a := startReplica(t, env, rulesPath, ns, "replica-a")
	poll("replica-a to lead", func() bool { return holder() == "replica-a" })
	b := startReplica(t, env, rulesPath, ns, "replica-b")
	poll("40 children at v1", func() bool { return len(atVersion("v1")) == 40 })

	writeFile(t, filepath.Dir(rulesPath), "rules.yaml", rolloutRuleFile(ns, "v2", "v2", "progressDeadline: 1h"))
	var step1 []string
	poll("step 1: 4 children at v2", func() bool { step1 = atVersion("v2"); return len(step1) == 4 })
	markReady(t, cms, "v2", step1)
	var step2 []string
	poll("step 2: 8 children at v2", func() bool { step2 = atVersion("v2"); return len(step2) == 8 })
	poll("step 2 recorded", func() bool { return revisionRollout(t, cs, ns).Step == 2 })

	a.cancel()
	poll("replica-b to lead", func() bool { return holder() == "replica-b" })
	poll("the new leader to resume the rollout", func() bool {
		return strings.Contains(httpGet("http://"+b.probes+"/readyz"), "rollout roll: Progressing, step 2 of 10, 8 triggers on revision")
	})
	if got := atVersion("v2"); len(got) != 8 {
		t.Fatalf("after the handover %d children at v2, want the 8 of step 2", len(got))
	}
	markReady(t, cms, "v2", step2)
	poll("step 3 by the new leader", func() bool { return len(atVersion("v2")) == 12 && revisionRollout(t, cs, ns).Step == 3 })
}

// TestRolloutSharded: three replicas share the triggers; a rule change
// moves the first triggers in rollout order — counted over the whole
// rule, whichever replica owns them — step by step, each once its
// children are ready; a replica killed mid-rollout neither moves a
// trigger twice nor skips one.
func TestRolloutSharded(t *testing.T) {
	sc := newShardCluster(t)
	sc.rule = "roll"
	ctx := t.Context()
	cms := sc.cs.CoreV1().ConfigMaps(sc.ns)
	writeFile(t, sc.dir, "rules.yaml", rolloutRuleFile(sc.ns, "v1", "", ""))
	names := createRolloutTriggers(t, cms, 60)
	// The rollout order: the triggers by the SHA-256 of rule and key.
	digest := func(name string) string {
		sum := sha256.Sum256([]byte("roll\x00" + sc.ns + "/" + name))
		return hex.EncodeToString(sum[:8])
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(digest(a), digest(b)) })
	atV2 := func() []string {
		var out []string
		for _, c := range childrenAt(t, cms, "v2") {
			out = append(out, strings.TrimSuffix(c, "-child"))
		}
		slices.SortFunc(out, func(a, b string) int { return strings.Compare(digest(a), digest(b)) })
		return out
	}
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 90*time.Second, what, cond) }
	for _, name := range []string{"a", "b", "c"} {
		sc.start(name)
	}
	sc.readyWith("a", "b", "c")
	poll("60 children", func() bool {
		list, _ := cms.List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=roll"})
		return list != nil && len(list.Items) == 60
	})

	writeFile(t, sc.dir, "rules.yaml", rolloutRuleFile(sc.ns, "v2", "v2", "progressDeadline: 1h"))
	step := func(k int) {
		t.Helper()
		var got []string
		poll(fmt.Sprintf("step %d: the first %d triggers in rollout order at v2", k, 6*k), func() bool {
			got = atV2()
			return slices.Equal(got, names[:6*k])
		})
	}
	ready := func(k int) {
		t.Helper()
		var children []string
		for _, n := range names[6*(k-1) : 6*k] {
			children = append(children, n+"-child")
		}
		markReady(t, cms, "v2", children)
	}
	step(1)
	ready(1)
	step(2)
	if rec := revisionRollout(t, sc.cs, sc.ns); rec.Step != 2 || rec.Steps != 10 || rec.Moved != 12 {
		t.Fatalf("recorded: %+v", rec)
	}

	if err := sc.replicas["a"].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-sc.replicas["a"].exited
	sc.readyWith("b", "c")
	if got := atV2(); !slices.Equal(got, names[:12]) {
		t.Fatalf("after the handover at v2: %v, want the first 12", got)
	}
	ready(2)
	step(3)
}

// TestDryRunRollout: under run --dry-run a rule change rolls out as it
// would, each step printed with the updates it plans; nothing is written.
func TestDryRunRollout(t *testing.T) {
	env, cs, _ := clients(t)
	ns := newNamespace(t, cs, "rollout-dry")
	cms := cs.CoreV1().ConfigMaps(ns)
	createRolloutTriggers(t, cms, 20)
	dir := t.TempDir()
	writeFile(t, dir, "rules.yaml", rolloutRuleFile(ns, "v1", "", ""))
	children := func(version string) int { return len(childrenAt(t, cms, version)) }
	// The children at v1, made by a run that then stops.
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, []string{"run", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, io.Discard, io.Discard)
	}()
	pollUntil(t, 60*time.Second, "20 children at v1", func() bool { return children("v1") == 20 })
	cancel()
	<-exited

	var out syncBuffer
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	probes := freeAddr(t)
	go func() {
		exited <- runContext(ctx, []string{"run", "--dry-run", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
			"--metrics-bind-address", "0", "--health-probe-bind-address", probes}, &out, io.Discard)
	}()
	pollUntil(t, 60*time.Second, "the dry run running", func() bool { return strings.Contains(httpGet("http://"+probes+"/readyz"), "rule roll: running") })
	writeFile(t, dir, "rules.yaml", rolloutRuleFile(ns, "v2", "", ""))
	pollUntil(t, 60*time.Second, "the dry run's rollout complete", func() bool { return strings.Contains(out.String(), "Rollout of rule roll: RolloutComplete:") })
	cancel()
	<-exited
	text := out.String()
	if !strings.Contains(text, "Rollout of rule roll: RolloutStep: step 1 of 10: 2 triggers move to revision ") ||
		!strings.Contains(text, "Rollout of rule roll: RolloutStep: step 10 of 10: ") || strings.Count(text, "~ update  v1 ConfigMap "+ns+"/") != 20 {
		t.Errorf("dry run:\n%s", text)
	}
	// Step 1's updates come after its line, before step 2's.
	step1, step2 := strings.Index(text, "step 1 of 10"), strings.Index(text, "step 2 of 10")
	if n := strings.Count(text[step1:step2], "~ update"); n != 2 {
		t.Errorf("step 1 planned %d updates, want 2:\n%s", n, text)
	}
	if children("v2") != 0 || children("v1") != 20 {
		t.Error("the dry run wrote")
	}
}

// TestRolloutKeepsItsRevision: the history limit never prunes the
// revision a rollout moves from — a restart needs it for the triggers not
// moved — and prunes it once the rollout is complete.
func TestRolloutKeepsItsRevision(t *testing.T) {
	env, cs, _ := clients(t)
	ns := newNamespace(t, cs, "rollout-keep")
	cms := cs.CoreV1().ConfigMaps(ns)
	createRolloutTriggers(t, cms, 4)
	dir := t.TempDir()
	limited := func(version, ready, rollout string) string {
		return strings.Replace(rolloutRuleFile(ns, version, ready, rollout), "  rollout:", "  revisionHistoryLimit: 1\n  rollout:", 1)
	}
	writeFile(t, dir, "rules.yaml", limited("v1", "", ""))
	revisions := func() int {
		list, err := cs.AppsV1().ControllerRevisions(ns).List(t.Context(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=roll"})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	atV2 := func() []string { return childrenAt(t, cms, "v2") }
	start := func() (probes string, stop func()) {
		probes = freeAddr(t)
		ctx, cancel := context.WithCancel(context.Background())
		exited := make(chan int, 1)
		go func() {
			exited <- runContext(ctx, []string{"run", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
				"--metrics-bind-address", "0", "--health-probe-bind-address", probes}, io.Discard, io.Discard)
		}()
		return probes, func() { cancel(); <-exited }
	}
	probes, stop := start()
	pollUntil(t, 60*time.Second, "the first revision", func() bool {
		return revisions() == 1 && strings.Contains(httpGet("http://"+probes+"/readyz"), "rule roll: running")
	})
	writeFile(t, dir, "rules.yaml", limited("v2", "v2", "step: 2, progressDeadline: 1h"))
	pollUntil(t, 60*time.Second, "step 1 recorded", func() bool { return revisionRollout(t, cs, ns).Step == 1 && len(atV2()) == 2 })
	if n := revisions(); n != 2 {
		t.Fatalf("%d revisions during the rollout, want 2: the one in force and the one it moves from", n)
	}
	stop()
	probes, stop = start()
	defer func() { stop() }()
	pollUntil(t, 60*time.Second, "the rollout resumed", func() bool {
		return strings.Contains(httpGet("http://"+probes+"/readyz"), "rollout roll: Progressing, step 1 of 2, 2 triggers on revision")
	})
	pollUntil(t, 60*time.Second, "the rollout complete", func() bool {
		markReady(t, cms, "v2", atV2())
		return revisionRollout(t, cs, ns).State == "Complete"
	})
	// The next load prunes the history to its limit.
	writeFile(t, dir, "rules.yaml", limited("v2", "v2", "step: 2, progressDeadline: 2h"))
	pollUntil(t, 60*time.Second, "the history pruned to 1", func() bool { return revisions() == 1 })
}

// createRolloutTriggers creates n triggers of rolloutRules, t000 on, and
// returns their names.
func createRolloutTriggers(t *testing.T, cms typedcorev1.ConfigMapInterface, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		name := fmt.Sprintf("t%03d", i)
		names = append(names, name)
		if _, err := cms.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: map[string]string{"rollout": "trigger"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// childrenAt are the names of rule roll's children holding version,
// sorted.
func childrenAt(t *testing.T, cms typedcorev1.ConfigMapInterface, version string) []string {
	t.Helper()
	list, err := cms.List(context.Background(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=roll"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, cm := range list.Items {
		if cm.Data["version"] == version {
			out = append(out, cm.Name)
		}
	}
	slices.Sort(out)
	return out
}
