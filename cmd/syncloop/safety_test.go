package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

var reloadErrors = regexp.MustCompile(`(?m)^syncloop_rules_reload_total\{result="error"\} (\d+)$`)

// TestRulesVanishing: every rule file broken, then the rule directory gone —
// syncloop keeps its last good rules in force (a deleted child is still
// repaired) and deletes nothing.
func TestRulesVanishing(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vanish-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cms := cs.CoreV1().ConfigMaps(ns.Name)
	dir := filepath.Join(t.TempDir(), "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(fanoutRules, "NS", ns.Name)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"fanout": "yes"}},
		Data:       map[string]string{"v": "1"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	metrics, probes := freeAddr(t), freeAddr(t)
	runCtx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(runCtx, []string{"run", "-f", dir, "--kubeconfig", env.Kubeconfig(),
			"--metrics-bind-address", metrics, "--health-probe-bind-address", probes}, io.Discard, io.Discard)
	}()
	defer func() {
		cancel()
		if code := <-exited; code != 0 {
			t.Errorf("syncloop run exited %d", code)
		}
	}()

	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true,
			func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	uid := func(name string) string {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(cm.UID)
	}
	poll("the children", func() bool { return uid("t-a") != "" && uid("t-b") != "" && uid("t-c") != "" })
	kept := uid("t-c")
	errorsReported := func(n int) func() bool {
		return func() bool {
			m := reloadErrors.FindStringSubmatch(httpGet("http://" + metrics + "/metrics"))
			if m == nil {
				return false
			}
			got, _ := strconv.Atoi(m[1])
			return got >= n
		}
	}
	repaired := func(name string) {
		t.Helper()
		old := uid(name)
		if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(name+" to be repaired: the rule is still in force", func() bool { u := uid(name); return u != "" && u != old })
	}

	if err := os.WriteFile(file, []byte("apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nspec: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	poll("the broken file to be reported", errorsReported(1))
	if body := httpGet("http://" + probes + "/readyz"); !strings.Contains(body, "rule fanout: running") || !strings.Contains(body, "rules.yaml") {
		t.Errorf("/readyz does not show the rule running and the broken file:\n%s", body)
	}
	repaired("t-a")

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	poll("the missing directory to be reported", errorsReported(2))
	repaired("t-b")
	if uid("t-c") != kept {
		t.Error("t-c was deleted while the rule files were broken or gone")
	}
}
