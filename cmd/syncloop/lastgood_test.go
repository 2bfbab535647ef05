package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// TestBrokenFileAfterRestart: a syncloop started while a rule file does
// not load runs the version of it an earlier process ran — recovered from
// the rules' revisions, which name the file they came from — instead of
// nothing: a crash, a new replica or a rolling update while the rules
// ConfigMap holds a mistake keeps the rules running. /readyz says so; no
// revision is written for it; once the file is fixed, its new version
// runs. A rule removed from the file before is not brought back; a
// revision naming another directory's file keeps its mark.
func TestBrokenFileAfterRestart(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "lastgood")
	dir := t.TempDir()
	rule := func(suffix string) string { return copyRule("keep", ns, "${object.data.v}"+suffix) }
	gone := fmt.Sprintf(`---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: gone}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: %s, labelSelector: gone}
  resources:
    - id: copy
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-gone"}}
`, ns)
	file := writeFile(t, dir, "keep.yaml", rule("")+gone)
	// A revision of a rule another rules directory held: its mark is not
	// this process's to take off (no start of it asks for that file).
	elsewhere := "/srv/other-rules/elsewhere.yaml"
	if _, err := cs.AppsV1().ControllerRevisions(ns).Create(ctx, &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere-1",
		Labels:      map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "elsewhere"},
		Annotations: map[string]string{rules.AnnotationSourceFile: elsewhere, rules.AnnotationRuleHash: "h"}},
		Data: runtime.RawExtension{Raw: []byte(`{}`)}, Revision: 1}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns}
	_, probes, stop := startInProcess(t, args...)
	readyz, poll := probing(t, probes, 30*time.Second)
	trigger, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"keep": "yes"}},
		Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	copyHolds := func(v string) func() bool {
		return func() bool {
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-copy", metav1.GetOptions{})
			return err == nil && cm.Data["v"] == v
		}
	}
	poll("the copy", copyHolds("1"))
	revisions := func(rule string) []string {
		list, err := cs.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=" + rule})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, cr := range list.Items {
			out = append(out, cr.Name+"@"+cr.Annotations[rules.AnnotationSourceFile])
		}
		return out
	}
	poll("the rule's revision, naming its file", func() bool { r := revisions("keep"); return len(r) == 1 && strings.HasSuffix(r[0], "@"+file) })
	poll("the other rule's revision, naming its file", func() bool { r := revisions("gone"); return len(r) == 1 && strings.HasSuffix(r[0], "@"+file) })
	writeFile(t, dir, "keep.yaml", rule(""))
	poll("the removed rule's revision to name no file", func() bool { r := revisions("gone"); return len(r) == 1 && strings.HasSuffix(r[0], "@") })
	if r := revisions("elsewhere"); fmt.Sprint(r) != "[elsewhere-1@"+elsewhere+"]" {
		t.Errorf("the revision of another directory's rule: %v, want its mark of %s kept", r, elsewhere)
	}
	stop()

	if err := os.WriteFile(filepath.Join(dir, "keep.yaml"), []byte("apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := revisions("keep")
	_, probes = runInProcess(t, args...)
	readyz, poll = probing(t, probes, 30*time.Second)
	poll("/readyz to say the last good version was recovered", func() bool {
		return strings.Contains(readyz(), "recovered from the rules' revisions") && strings.Contains(readyz(), "rule keep: running")
	})
	trigger.Data["v"] = "2"
	if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, trigger, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the recovered rule to follow its trigger", copyHolds("2"))
	if strings.Contains(readyz(), "rule gone") {
		t.Errorf("the removed rule is back:\n%s", readyz())
	}
	if after := revisions("keep"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("revisions %v, want %v: the recovered version is the revision it came from", after, before)
	}

	writeFile(t, dir, "keep.yaml", rule("-fixed"))
	poll("the fixed file's version", copyHolds("2-fixed"))
}

// TestBrokenFileTakesNewerRevision: a replica that loaded a version of a
// file, missed the next one another replica loaded and recorded (it was
// paused, slow to start, or its ConfigMap volume late), and then reads
// the file broken, runs the newer version the revisions hold — not its
// own older one — and records nothing: replicas of a sharded group run
// one version of a rule, and none makes its own the newest over the
// others' (the fault campaign caught a restarted replica doing so three
// times a second, its triggers kept at the old version). And a version
// another replica records only after the file broke here (its recording
// had failed, and succeeded on a retry) is followed too, the file
// unchanged: the campaign caught two replicas of three running the
// version before for good.
func TestBrokenFileTakesNewerRevision(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "newer")
	dir := t.TempDir()
	rule := func(v string) string { return copyRule("newer", ns, v) }
	file := writeFile(t, dir, "newer.yaml", rule("old"))
	_, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	readyz, poll := probing(t, probes, 30*time.Second)
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"newer": "yes"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	copyHolds := func(v string) func() bool {
		return func() bool {
			cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-copy", metav1.GetOptions{})
			return err == nil && cm.Data["v"] == v
		}
	}
	poll("the old version's copy", copyHolds("old"))
	list := func() string {
		revs, err := cs.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=newer"})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, cr := range revs.Items {
			out = append(out, fmt.Sprintf("%s=%d", cr.Annotations[rules.AnnotationRuleHash][:10], cr.Revision))
		}
		sort.Strings(out)
		return strings.Join(out, " ")
	}
	poll("the old version's revision", func() bool { return strings.Count(list(), "=") == 1 })

	// recordElsewhere records version v as another replica that loaded
	// it does, numbered revision.
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recordElsewhere := func(v string, revision int64) {
		t.Helper()
		parsed, err := l.Parse(file, []byte(rule(v)))
		if err != nil {
			t.Fatal(err)
		}
		r := parsed.Rules[0]
		if _, err := cs.AppsV1().ControllerRevisions(ns).Create(ctx, &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "newer-" + r.Hash[:10],
			Labels:      map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "newer"},
			Annotations: map[string]string{rules.AnnotationSourceFile: file, rules.AnnotationRuleHash: r.Hash}},
			Data: runtime.RawExtension{Raw: r.Source}, Revision: revision}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	recordElsewhere("new", 2)
	want := list()

	writeFile(t, dir, "newer.yaml", "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: newer\n")
	poll("/readyz to say the newer version was recovered", func() bool {
		return strings.Contains(readyz(), "recovered from the rules' revisions")
	})
	poll("the newer version's copy", copyHolds("new"))
	if got := list(); got != want {
		t.Errorf("revisions %s, want %s: a replica whose file broke records nothing", got, want)
	}

	recordElsewhere("newest", 3)
	poll("the version recorded after the file broke to be followed", copyHolds("newest"))
}

// copyRule is a rule named name that copies each ConfigMap of ns labelled
// name to <its name>-copy, with data v: the template v.
func copyRule(name, ns, v string) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %[1]s}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: %[2]s, labelSelector: %[1]s}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: {v: "%[3]s"}
  rollout: {strategy: Immediate}
`, name, ns, v)
}
