package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// newNamespace creates a namespace named from prefix and returns its name.
func newNamespace(t *testing.T, cs kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// pollUntil checks cond every 20 ms and fails the test if it does not hold
// within timeout.
func pollUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// probing reads the /readyz of a syncloop serving its probes at probes,
// and polls for a condition up to timeout, logging /readyz if the test
// fails.
func probing(t *testing.T, probes string, timeout time.Duration) (readyz func() string, poll func(what string, cond func() bool)) {
	readyz = func() string { return httpGet("http://" + probes + "/readyz") }
	poll = func(what string, cond func() bool) {
		t.Helper()
		defer func() {
			if t.Failed() {
				t.Logf("/readyz:\n%s", readyz())
			}
		}()
		pollUntil(t, timeout, what, cond)
	}
	return readyz, poll
}

// runInProcess runs `syncloop run` with args, serving metrics and probes on
// free addresses it returns, until the test ends; the test fails if it
// exits other than 0.
func runInProcess(t *testing.T, args ...string) (metrics, probes string) {
	t.Helper()
	metrics, probes, stop := startInProcess(t, args...)
	t.Cleanup(stop)
	return metrics, probes
}

// startInProcess is runInProcess until stop, which waits for the exit
// (and may be called again: it then does nothing).
func startInProcess(t *testing.T, args ...string) (metrics, probes string, stop func()) {
	t.Helper()
	metrics, probes = freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, append(append([]string{"run"}, args...),
			"--metrics-bind-address", metrics, "--health-probe-bind-address", probes), io.Discard, io.Discard)
	}()
	var once sync.Once
	return metrics, probes, func() {
		once.Do(func() {
			cancel()
			if code := <-exited; code != 0 {
				t.Errorf("syncloop run exited %d", code)
			}
		})
	}
}

// writeFile writes content to dir/name and returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// grantConfigMaps gives ServiceAccount ns/sa a Role there that may manage
// ConfigMaps and read Secrets, and nothing else.
func grantConfigMaps(t *testing.T, cs kubernetes.Interface, ns, sa string) {
	t.Helper()
	ctx := t.Context()
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: sa}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: sa},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// namespaceRule is a rule named name that makes one ConfigMap, also named
// name, in namespace ns: a rule beside the one a test is about.
func namespaceRule(name, ns string) string {
	return strings.NewReplacer("NAME", name, "NS", ns).Replace(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata:
  name: NAME
spec:
  watch: {apiVersion: v1, kind: Namespace, fieldSelector: metadata.name=NS}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: NAME, namespace: "${object.metadata.name}"}
`)
}
