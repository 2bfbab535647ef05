package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/examplefn"
	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// runAsSyncloop, set in a child's environment, makes this test binary be
// syncloop: tests that must SIGKILL syncloop run it as a process of its own
// without building it first.
const runAsSyncloop = "SYNCLOOP_TEST_RUN_AS_SYNCLOOP"

func TestMain(m *testing.M) {
	if os.Getenv(runAsSyncloop) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	// The examples' functions, for the tests that load the examples.
	if err := examplefn.Build(examplesDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The chart test runs the examples, and the ci-robot chain waits for
	// the token controller. No garbage collector: the plan tests show what
	// syncloop itself would delete.
	testenv.Main(m, testenv.Options{ControllerManager: true, Controllers: []string{"serviceaccount-token"}})
}

const planRules = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: copy}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: plan-test, labelSelector: plan}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: ${object.?data}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: secret-copy}
spec:
  watch: {apiVersion: v1, kind: Secret, namespace: plan-test, labelSelector: plan}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: Secret
        metadata: {name: "${object.metadata.name}-copy"}
        data: ${object.?data}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: widget}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: plan-test}
  status:
    size: ${object.spec.size}
`

var widgetsGVR = schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "widgets"}

// converge runs the engine on rulesPath until every trigger is reconciled.
func converge(t *testing.T, env *testenv.Env, rulesPath string, done func() bool) {
	t.Helper()
	l, _ := rules.NewLoader(expr.Options{})
	set, err := l.Load(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := dynamic.NewClient(env.Config())
	disco, _ := discovery.NewDiscoveryClientForConfig(env.Config())
	eng := engine.New(engine.Options{Client: cl, Mapper: dynamic.NewMapper(disco, 0)})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = eng.Run(ctx, set, nil) }()
	defer func() { cancel(); <-stopped }()
	if err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return done(), nil }); err != nil {
		t.Fatal("the engine did not converge")
	}
}

var (
	uidPattern  = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	timePattern = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
)

func TestPlan(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	dc, _ := k8sdynamic.NewForConfig(env.Config())
	if _, err := env.InstallCRDs(ctx, filepath.Join("testdata", "widgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	created, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "plan-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := created.Name // shown as plan-test in the golden files
	cm := func(name, v string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"plan": "yes"}}, Data: map[string]string{"k": v}}
	}
	for _, c := range []*corev1.ConfigMap{cm("a", "1"), cm("b", "1")} {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{"plan": "yes"}},
		Data: map[string][]byte{"password": []byte("first-Secret-value")}}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "test.syncloop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w"}, "spec": map[string]any{"size": int64(1)}}}
	if _, err := dc.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(strings.ReplaceAll(planRules, "plan-test", ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	exists := func(kind, name string) bool {
		var err error
		if kind == "Secret" {
			_, err = cs.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
		} else {
			_, err = cs.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
		}
		return err == nil
	}
	widgetSize := func() any {
		got, err := dc.Resource(widgetsGVR).Namespace(ns).Get(context.Background(), "w", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		v, _, _ := unstructured.NestedFieldNoCopy(got.Object, "status", "size")
		return v
	}
	converge(t, env, rulesPath, func() bool {
		return exists("ConfigMap", "a-copy") && exists("ConfigMap", "b-copy") && exists("Secret", "s-copy") && widgetSize() == int64(1)
	})

	plan := func(extra ...string) (int, string, string) {
		return syncloop(t, append([]string{"plan", "-f", rulesPath, "--kubeconfig", env.Kubeconfig()}, extra...)...)
	}
	if code, out, errOut := plan(); code != 0 || out != "Plan: 0 to create, 0 to update, 0 to delete, 0 status updates.\n" {
		t.Fatalf("plan of a converged cluster: exit %d, stdout %q, stderr %q; want 0 and an empty plan", code, out, errOut)
	}

	// While syncloop is not running: a trigger changes, one is deleted, one
	// is created, the Secret changes, the Widget changes.
	a, _ := cs.CoreV1().ConfigMaps(ns).Get(ctx, "a", metav1.GetOptions{})
	a.Data["k"] = "2"
	if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm("c", "1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A trigger whose child's name an object syncloop did not create
	// holds: a conflict, not an update.
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "d-copy"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm("d", "1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s, _ := cs.CoreV1().Secrets(ns).Get(ctx, "s", metav1.GetOptions{})
	s.Data["password"] = []byte("second-Secret-value")
	if _, err := cs.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "w", "application/merge-patch+json", []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	code, text, errText := plan()
	if code != 2 {
		t.Fatalf("plan with changes pending: exit %d, want 2\n%s\n%s", code, text, errText)
	}
	if strings.Contains(errText, "d-copy") {
		t.Errorf("the conflict was reported as a failure: %s", errText)
	}
	// The progress a terminal shows, at its end: the 5 triggers (3
	// ConfigMaps, the Secret, the Widget) planned, none left queued.
	l, _ := rules.NewLoader(expr.Options{})
	set, err := l.Load(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := manager.NewClients(env.Config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var progress [2]int64
	if _, _, err := manager.Plan(ctx, mc, set, manager.PlanOptions{Stdout: io.Discard, Stderr: io.Discard,
		Progress: func(planned, queued int64) { progress = [2]int64{planned, queued} }}); err != nil {
		t.Fatal(err)
	}
	if progress[0] < 5 || progress[1] != 0 {
		t.Errorf("plan's last progress: %d reconciles planned, %d queued; want at least 5, and 0", progress[0], progress[1])
	}
	code, jsonOut, errJSON := plan("-o", "json")
	if code != 2 {
		t.Fatalf("plan -o json with changes pending: exit %d, want 2", code)
	}
	normalize := func(s string) string {
		s = timePattern.ReplaceAllString(uidPattern.ReplaceAllString(s, "<uid>"), "<time>")
		return strings.ReplaceAll(s, ns, "plan-test")
	}
	golden(t, filepath.Join("testdata", "plan.txt"), normalize(text))
	golden(t, filepath.Join("testdata", "plan.jsonl"), normalize(jsonOut))

	for _, secretValue := range []string{"first-Secret-value", "second-Secret-value",
		base64.StdEncoding.EncodeToString([]byte("first-Secret-value")), base64.StdEncoding.EncodeToString([]byte("second-Secret-value"))} {
		for name, out := range map[string]string{"text": text + errText, "json": jsonOut + errJSON} {
			if strings.Contains(out, secretValue) {
				t.Errorf("the %s plan shows a Secret value (%s)", name, secretValue)
			}
		}
	}
	// Nothing was persisted by planning.
	if exists("ConfigMap", "c-copy") || !exists("ConfigMap", "b-copy") || widgetSize() != int64(1) {
		t.Error("plan changed the cluster")
	}

	// A rule that fails to render: exit 1, the error on stderr.
	broken := planRules + "---\n" + `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: broken}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: plan-test, labelSelector: plan}
  resources:
    - id: x
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.data.missing}"}}
`
	if err := os.WriteFile(rulesPath, []byte(strings.ReplaceAll(broken, "plan-test", ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := plan()
	if code != 1 || !strings.Contains(errOut, "no such key: missing") {
		t.Errorf("plan with a failing rule: exit %d, stderr %q; want 1 and the error", code, errOut)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRunDryRun: `syncloop run --dry-run` prints the plan as it reconciles,
// persists nothing, and exits 0 when stopped.
func TestRunDryRun(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	created, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "dry-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := created.Name
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a",
		Labels: map[string]string{"plan": "yes"}}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// b's child's name is held by an object syncloop did not create.
	for _, c := range []*corev1.ConfigMap{{ObjectMeta: metav1.ObjectMeta{Name: "b-copy"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"plan": "yes"}}}} {
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(t.Context(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	first := strings.SplitN(planRules, "---", 2)[0]
	if err := os.WriteFile(rulesPath, []byte(strings.ReplaceAll(first, "plan-test", ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, []string{"run", "--dry-run", "-o", "json", "-f", rulesPath, "--kubeconfig", env.Kubeconfig(),
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, &out, &errOut)
	}()
	err = wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return strings.Contains(out.String(), `"action":"create"`) && strings.Contains(out.String(), `"action":"conflict"`), nil
	})
	if err != nil {
		t.Fatalf("no planned create and conflict; stdout %q stderr %q", out.String(), errOut.String())
	}
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("run --dry-run exited %d when stopped, want 0", code)
	}
	if !strings.Contains(out.String(), `"object":{"apiVersion":"v1","kind":"ConfigMap","namespace":"`+ns+`","name":"a-copy"}`) {
		t.Errorf("plan = %s", out.String())
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(context.Background(), "a-copy", metav1.GetOptions{}); err == nil {
		t.Error("run --dry-run created a child")
	}
	if !strings.Contains(out.String(), `"action":"conflict","rule":"copy","trigger":{"apiVersion":"v1","kind":"ConfigMap","namespace":"`+ns+`","name":"b"}`) {
		t.Errorf("no conflict planned for b: %s", out.String())
	}
}
