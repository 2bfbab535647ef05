package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRevisions: every version of a rule put in force is a revision in
// syncloop's namespace — a ControllerRevision labelled with the rule,
// holding its source, numbered in order; a version undone is its old
// revision renumbered as the newest; revisionHistoryLimit bounds them
// (with Immediate changes: a rollout keeps the revision it moves from,
// TestRolloutKeepsItsRevision).
func TestRevisions(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "revisions")
	dir := filepath.Join(t.TempDir(), "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	version := func(workers int, extra string) string {
		return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: versioned}
spec:
  watch: {apiVersion: v1, kind: Namespace, fieldSelector: metadata.name=%s}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: versioned, namespace: "${object.metadata.name}"}}
  workers: %d
  rollout: {strategy: Immediate}
%s`, ns, workers, extra)
	}
	file := filepath.Join(dir, "rule.yaml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(file+".tmp", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write(version(1, ""))
	_, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	_, poll := probing(t, probes, 30*time.Second)

	// history is the rule's revisions, "number:workers" oldest first.
	history := func() string {
		list, err := cs.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{LabelSelector: "syncloop.dev/rule=versioned"})
		if err != nil {
			t.Fatal(err)
		}
		sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Revision < list.Items[j].Revision })
		var out []string
		for _, cr := range list.Items {
			var rule struct {
				Kind string
				Spec struct{ Workers int }
			}
			if err := json.Unmarshal(cr.Data.Raw, &rule); err != nil || rule.Kind != "Rule" {
				t.Fatalf("revision %s holds %q: %v", cr.Name, cr.Data.Raw, err)
			}
			if !strings.HasPrefix(cr.Name, "versioned-") || cr.Annotations["syncloop.dev/rule-hash"] == "" || cr.Labels["app.kubernetes.io/managed-by"] != "syncloop" {
				t.Errorf("revision %s: labels %v annotations %v", cr.Name, cr.Labels, cr.Annotations)
			}
			out = append(out, fmt.Sprintf("%d:%d", cr.Revision, rule.Spec.Workers))
		}
		return strings.Join(out, " ")
	}
	expect := func(want string) {
		t.Helper()
		var got string
		poll("revisions "+want, func() bool { got = history(); return got == want })
	}
	expect("1:1")
	write(version(2, ""))
	expect("1:1 2:2")
	write(version(1, "")) // undone: the first revision is the newest again
	expect("2:2 3:1")
	write(version(3, "  revisionHistoryLimit: 2\n"))
	expect("3:1 4:3")
	write(version(4, "  revisionHistoryLimit: 2\n"))
	expect("4:3 5:4")

	// syncloop rollout status reads them back, newest first.
	code, out, errOut := syncloop(t, "rollout", "status", "versioned", "-n", ns, "--kubeconfig", env.Kubeconfig())
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "RULE") ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1])[:4], " "), "versioned 5 (newest) versioned-") || strings.Fields(lines[2])[1] != "4" ||
		!strings.HasSuffix(lines[1], " -") {
		t.Errorf("rollout status: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = syncloop(t, "rollout", "status", "-n", ns, "-o", "json", "--kubeconfig", env.Kubeconfig())
	var doc struct {
		Revisions []struct {
			Rule     string
			Revision int64
			Hash     string
			Newest   bool
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || len(doc.Revisions) != 2 ||
		doc.Revisions[0].Revision != 5 || !doc.Revisions[0].Newest || doc.Revisions[1].Newest || len(doc.Revisions[0].Hash) != 64 {
		t.Errorf("rollout status -o json: exit %d, %v\n%s", code, err, out)
	}

	// The rule removed: its history stays.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	poll("the rule gone", func() bool { return !strings.Contains(httpGet("http://"+probes+"/readyz"), "versioned") })
	if got := history(); got != "4:3 5:4" {
		t.Errorf("revisions after the rule's removal: %s", got)
	}
}

// TestLoadErrorsOnConfigMap: with --rules-configmap, a rule file that
// does not load is a Warning Event on that ConfigMap — where `kubectl
// describe configmap` shows it — with its file:line:col, said once; when
// every file loads again, a Normal Event says so.
func TestLoadErrorsOnConfigMap(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "announce")
	cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "syncloop-rules"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: announced}\nspec:\n  watch: {apiVersion: v1, kind: Namespace, fieldSelector: metadata.name=" + ns + "}\n  status: {}\n"
	file := writeFile(t, dir, "rule.yaml", good)
	_, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns, "--rules-configmap", ns+"/syncloop-rules")
	_, poll := probing(t, probes, 30*time.Second)
	poll("the rule running", func() bool { return strings.Contains(httpGet("http://"+probes+"/readyz"), "rule announced: running") })

	// events are the ConfigMap's Events, as kubectl describe finds them.
	events := func() []corev1.Event {
		list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ConfigMap,involvedObject.name=syncloop-rules,involvedObject.uid=" + string(cm.UID)})
		if err != nil {
			t.Fatal(err)
		}
		return list.Items
	}
	if evs := events(); len(evs) != 0 {
		t.Errorf("Events with every file loading: %v", evs)
	}
	if err := os.WriteFile(file, []byte(strings.Replace(good, "  status: {}\n", "  status: {}\n  workerz: 2\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	poll("a Warning Event on the ConfigMap", func() bool {
		for _, e := range events() {
			if e.Type == corev1.EventTypeWarning && e.Reason == "RuleFileNotLoaded" &&
				strings.Contains(e.Message, `rule.yaml:7:3: rule "announced": spec: unknown field "workerz" (did you mean "workers"?)`) &&
				strings.Contains(e.Message, "its last good version stays in force") {
				return true
			}
		}
		return false
	})
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	poll("a Normal Event once it loads again", func() bool {
		for _, e := range events() {
			if e.Type == corev1.EventTypeNormal && e.Reason == "RulesLoaded" {
				return true
			}
		}
		return false
	})
	warnings := 0
	for _, e := range events() {
		if e.Type == corev1.EventTypeWarning {
			warnings += int(e.Count)
		}
	}
	if warnings != 1 {
		t.Errorf("%d Warning Events for one broken version, want 1", warnings)
	}
}
