package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var helloGVR = schema.GroupVersionResource{Group: "example.syncloop.dev", Version: "v1", Resource: "helloworlds"}

// TestHelloHook runs examples/hello-hook as a user moving from
// Metacontroller would: its hook server (hook/main.go, which knows only
// Metacontroller's protocol) built and started, the example's rule
// pointing at it, `syncloop run` against the real API server. A
// HelloWorld gets its Pod, owned and labelled as syncloop's, greeting as
// the ConfigMap its customize hook relates says; its status is
// what the hook says of the Pods it was shown; the calls are in /metrics.
func TestHelloHook(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	if _, err := env.InstallCRDs(ctx, filepath.Join(examplesDir, "hello-hook", "crd.yaml")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "hook")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/hello-hook/hook").CombinedOutput(); err != nil {
		t.Fatalf("building the hook: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	hookCtx, stopHook := context.WithCancel(context.Background())
	hook := exec.CommandContext(hookCtx, bin, "-addr", addr)
	if err := hook.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopHook(); _ = hook.Wait() })

	// The example's rule, calling the hook where it listens here instead
	// of at its in-cluster Service.
	example, err := os.ReadFile(filepath.Join(examplesDir, "hello-hook", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rule := strings.NewReplacer(
		"      service: {name: hello-hook, namespace: hello}   # http://hello-hook.hello:80/sync\n      path: /sync\n", "      url: http://"+addr+"/sync\n",
		"        service: {name: hello-hook, namespace: hello}\n        path: /customize\n", "        url: http://"+addr+"/customize\n",
	).Replace(string(example))
	if strings.Count(rule, "url: http://"+addr) != 2 {
		t.Fatal("the example's webhook is not where this test expects it")
	}
	rules := filepath.Join(dir, "rules")
	if err := os.Mkdir(rules, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, rules, "hello.yaml", rule)
	ns := newNamespace(t, cs, "hello")
	// No controller manager here makes a namespace's default
	// ServiceAccount, which a Pod is admitted as.
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	metricsAddr, probes := runInProcess(t, "-f", rules, "--kubeconfig", env.Kubeconfig())
	readyz, poll := probing(t, probes, 60*time.Second)
	poll("the rule running", func() bool { return strings.Contains(readyz(), "rule hello-world: running") })

	// The ConfigMap the customize hook relates: the hook greets with it.
	greetings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "greetings"}, Data: map[string]string{"greeting": "Bonjour"}}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, greetings, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hw := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.syncloop.dev/v1", "kind": "HelloWorld",
		"metadata": map[string]any{"name": "world"}, "spec": map[string]any{"who": "syncloop"}}}
	created, err := dc.Resource(helloGVR).Namespace(ns).Create(ctx, hw, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll("the hook's Pod, syncloop's, greeting as the related ConfigMap says", func() bool {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, "world", metav1.GetOptions{})
		if err != nil {
			return false
		}
		owner := metav1.GetControllerOf(pod)
		return pod.Labels["syncloop.dev/rule"] == "hello-world" && owner != nil && owner.UID == created.GetUID() &&
			strings.Join(pod.Spec.Containers[0].Command, " ") == "echo Bonjour, syncloop!"
	})
	poll("the hook's status: the one Pod it was shown, and Ready", func() bool {
		got, err := dc.Resource(helloGVR).Namespace(ns).Get(ctx, "world", metav1.GetOptions{})
		if err != nil {
			return false
		}
		n, _, _ := unstructured.NestedInt64(got.Object, "status", "replicas")
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		ready := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			ready = ready || (m["type"] == "Ready" && m["status"] == "True")
		}
		return n == 1 && ready
	})
	page := httpGet("http://" + metricsAddr + "/metrics")
	if v := metricValue(page, `syncloop_function_calls_total{resource="sync",result="success",rule="hello-world",transport="webhook"}`); v < 2 {
		t.Errorf("syncloop_function_calls_total of the hook: %v, want at least 2 (the Pod made, then the status)", v)
	}
	if v := metricValue(page, `syncloop_function_calls_total{resource="sync/customize",result="success",rule="hello-world",transport="webhook"}`); v != 1 {
		t.Errorf("syncloop_function_calls_total of the customize hook: %v, want 1 (its answer kept while the HelloWorld is unchanged)", v)
	}
	if !strings.Contains(page, `syncloop_function_call_duration_seconds_count{resource="sync",rule="hello-world",transport="webhook"}`) {
		t.Error("no syncloop_function_call_duration_seconds for the hook")
	}
}
