package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRuleRemovedWhileDown: `syncloop run` with a rule that deletes its
// children on removal; stopped, the rule's file removed; started again,
// it finds the removal in the rule's revisions (as plan does, showing the
// deletes to come) and deletes the children,
// and records it on the rule's newest revision — `rollout status` says
// so — which makes it done once (TestRemovedFromRevisions).
func TestRuleRemovedWhileDown(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "removal")
	dir := filepath.Join(t.TempDir(), "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rule := writeFile(t, dir, "copies.yaml", fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: copies}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: %s, labelSelector: copy}
  removalPolicy: Delete
  rollout: {maxPrunes: 100%%}
  resources:
    - id: copy
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-copy"}}
`, ns))
	writeFile(t, dir, "other.yaml", fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: removal-bystander}
spec:
  watch: {apiVersion: v1, kind: Namespace, fieldSelector: metadata.name=%s}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: other, namespace: "${object.metadata.name}"}}
`, ns))
	for i := range 3 {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("t%d", i), Labels: map[string]string{"copy": "yes"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	copies := func() int {
		list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "syncloop.dev/rule=copies"})
		if err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	args := []string{"-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns}
	_, _, stop := startInProcess(t, args...)
	pollUntil(t, 30*time.Second, "the copies", func() bool { return copies() == 3 })
	stop()

	if err := os.Remove(rule); err != nil {
		t.Fatal(err)
	}
	// plan shows what the removal will delete, and deletes nothing.
	var plan bytes.Buffer
	code := runContext(ctx, []string{"plan", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--syncloop-namespace", ns}, &plan, &plan)
	if code != 2 || !strings.Contains(plan.String(), "- delete  v1 ConfigMap "+ns+"/t1-copy  (rule copies, trigger v1 ConfigMap "+ns+"/t1)") ||
		!strings.Contains(plan.String(), "3 to delete") || copies() != 3 {
		t.Errorf("plan exited %d with %d copies left:\n%s", code, copies(), plan.String())
	}
	startInProcess(t, args...)
	pollUntil(t, 30*time.Second, "the copies deleted on the rule's removal", func() bool { return copies() == 0 })
	var out bytes.Buffer
	pollUntil(t, 30*time.Second, "the removal in rollout status", func() bool {
		out.Reset()
		code := runContext(ctx, []string{"rollout", "status", "copies", "-n", ns, "--kubeconfig", env.Kubeconfig()}, &out, &out)
		return code == 0 && strings.Contains(out.String(), "removal of copies: Removed") && strings.Contains(out.String(), "3 of 3 children deleted")
	})
}
