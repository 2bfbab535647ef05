package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// stackRule defines Stack: each gets three ConfigMaps, web reading app
// and app reading db. A rule with spec.api tears down in order by
// default: web, then app, then db.
const stackRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: stack}
spec:
  api:
    apiVersion: teardown.example.syncloop.dev/v1
    kind: Stack
    spec:
      size: integer | default=1
  resources:
    - id: db
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-db"}
    - id: app
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-app"}
        data: {db: "${children.db.metadata.name}"}
    - id: web
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-web"}
        data: {app: "${children.app.metadata.name}"}
  status:
    web: "${children.web.metadata.name}"
`

// TestTeardownAcrossKill: a Stack (a kind a rule defines, so torn down in
// order) is deleted while its first two waves are held by another
// finalizer; syncloop is SIGKILLed mid-teardown and the restarted process
// goes on from the wave it reached, never deleting a child before those
// that read it are gone. With syncloop killed for good, the Stack waits;
// `syncloop finalizers list` shows it, and `finalizers remove` lets it go,
// its last child with it (the garbage collector).
func TestTeardownAcrossKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane of its own")
	}
	t.Parallel() // a control plane of its own: nothing shared with the other tests
	ctx := t.Context()
	// A control plane of its own, with the garbage collector: a child
	// deleted in the foreground goes once it has, and a trigger's last
	// child with the trigger.
	env, err := testenv.Start(ctx, testenv.Options{ControllerManager: true, Controllers: []string{"garbagecollector"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "teardown")
	cms := cs.CoreV1().ConfigMaps(ns)
	stacks := dc.Resource(schema.GroupVersionResource{Group: "teardown.example.syncloop.dev", Version: "v1", Resource: "stacks"}).Namespace(ns)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(stackRule), 0o644); err != nil {
		t.Fatal(err)
	}
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 60*time.Second, what, cond) }
	args := []string{"run", "-f", dir, "--kubeconfig", env.Kubeconfig(), "--watch-namespace", ns, "--manage-crds",
		"--metrics-bind-address=0", "--health-probe-bind-address=0"}
	kill := func(p interface{ Signal(os.Signal) error }) {
		t.Helper()
		if err := p.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	child := func(name string) (*corev1.ConfigMap, bool) {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		return cm, true
	}
	deleting := func(name string) bool { cm, ok := child(name); return ok && cm.DeletionTimestamp != nil }
	hold := func(name string, on bool) {
		t.Helper()
		cm, _ := child(name)
		if on {
			cm.Finalizers = append(cm.Finalizers, "test.syncloop.dev/hold")
		} else {
			cm.Finalizers = slices.DeleteFunc(cm.Finalizers, func(f string) bool { return f == "test.syncloop.dev/hold" })
		}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	stack := func() *unstructured.Unstructured {
		s, err := stacks.Get(ctx, "s", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	waveMessage := func(s *unstructured.Unstructured) string {
		conds, _, _ := unstructured.NestedSlice(s.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Ready" && m["reason"] == "TearingDown" {
				return m["message"].(string)
			}
		}
		return ""
	}

	first := syncloopProcess(t, "first", args...)
	poll("the Stack kind served", func() bool {
		_, err := stacks.List(ctx, metav1.ListOptions{})
		return err == nil
	})
	// The garbage collector learns of a new kind at its start, or within
	// 30 seconds: it is to collect a Stack's children.
	if err := env.RestartControllerManager(); err != nil {
		t.Fatal(err)
	}
	if _, err := stacks.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "teardown.example.syncloop.dev/v1", "kind": "Stack", "metadata": map[string]any{"name": "s"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the children and the finalizer", func() bool {
		_, web := child("s-web")
		s := stack()
		return web && s != nil && slices.Contains(s.GetFinalizers(), "teardown.syncloop.dev/stack")
	})
	hold("s-web", true)
	hold("s-app", true)
	if err := stacks.Delete(ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("wave 1 under way", func() bool {
		s := stack()
		return deleting("s-web") && s != nil && strings.HasPrefix(waveMessage(s), "deleting wave 1 of 3:")
	})

	kill(first.Process)
	_ = first.Wait()
	hold("s-web", false)
	poll("s-web gone", func() bool { _, ok := child("s-web"); return !ok })
	if deleting("s-app") || deleting("s-db") {
		t.Fatal("a later wave is being deleted while syncloop is down")
	}
	second := syncloopProcess(t, "second", args...)
	poll("wave 2 under way after the restart", func() bool {
		s := stack()
		return deleting("s-app") && s != nil && strings.HasPrefix(waveMessage(s), "deleting wave 2 of 3:")
	})
	if deleting("s-db") {
		t.Fatal("s-db is being deleted while s-app, which reads it, is not gone")
	}

	kill(second.Process)
	_ = second.Wait()
	hold("s-app", false)
	poll("s-app gone", func() bool { _, ok := child("s-app"); return !ok })
	if s := stack(); s == nil || !slices.Contains(s.GetFinalizers(), "teardown.syncloop.dev/stack") {
		t.Fatal("the Stack went without syncloop taking its finalizer off")
	}
	var out bytes.Buffer
	if code := runContext(ctx, []string{"finalizers", "list", "-n", ns, "--kubeconfig", env.Kubeconfig()}, &out, &out); code != 0 ||
		!strings.Contains(out.String(), "stacks.teardown.example.syncloop.dev  "+ns+"/s") || !strings.Contains(out.String(), "true") {
		t.Fatalf("finalizers list exited %d:\n%s", code, out.String())
	}
	out.Reset()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if code := runContext(rctx, []string{"finalizers", "remove", "-n", ns, "--kubeconfig", env.Kubeconfig()}, &out, &out); code != 0 ||
		!strings.Contains(out.String(), "removed teardown.syncloop.dev/stack from stacks.teardown.example.syncloop.dev "+ns+"/s") {
		t.Fatalf("finalizers remove exited %d:\n%s", code, out.String())
	}
	poll("the Stack gone, and its last child with it", func() bool { _, db := child("s-db"); return stack() == nil && !db })
}
