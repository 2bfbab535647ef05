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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRevisions: every version of a rule put in force is a revision in
// syncloop's namespace — a ControllerRevision labelled with the rule,
// holding its source, numbered in order; a version undone is its old
// revision renumbered as the newest; revisionHistoryLimit bounds them.
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
	// The rule removed: its history stays.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	poll("the rule gone", func() bool { return !strings.Contains(httpGet("http://"+probes+"/readyz"), "versioned") })
	if got := history(); got != "4:3 5:4" {
		t.Errorf("revisions after the rule's removal: %s", got)
	}
}
