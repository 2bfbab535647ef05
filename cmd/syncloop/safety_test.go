package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	ns := newNamespace(t, cs, "vanish")
	cms := cs.CoreV1().ConfigMaps(ns)
	dir := filepath.Join(t.TempDir(), "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(fanoutRules, "NS", ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"fanout": "yes"}},
		Data:       map[string]string{"v": "1"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	metrics, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig())
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 30*time.Second, what, cond) }
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

// TestForbiddenReported: run as a ServiceAccount that may not list Secrets,
// a rule watching them is reported where an operator looks — /readyz
// (503, quoting the refusal), syncloop_rule_ready and
// syncloop_watch_errors_total — while the rule it may run works.
func TestForbiddenReported(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "forbidden")
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmaps"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "syncloop", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa, err := env.ServiceAccountConfig(ctx, ns, "syncloop")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, sa, "syncloop"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rulesText := strings.ReplaceAll(fanoutRules, "NS", ns) + `---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: secret-keys}
spec:
  watch: {apiVersion: v1, kind: Secret, namespace: NS}
  resources:
    - id: keys
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-keys"}}
`
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(strings.ReplaceAll(rulesText, "NS", ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"fanout": "yes"}}, Data: map[string]string{"v": "1"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	metrics, probes := runInProcess(t, "-f", dir, "--kubeconfig", kubeconfig, "--watch-namespace", ns)
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 30*time.Second, what, cond) }
	poll("the allowed rule's children", func() bool {
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-c", metav1.GetOptions{})
		return err == nil
	})
	var body string
	poll("/readyz to report the forbidden rule", func() bool {
		resp, err := http.Get("http://" + probes + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "rule secret-keys: syncing: cannot list and watch secrets/v1 in "+ns) &&
			strings.Contains(body, "forbidden") && strings.Contains(body, "rule fanout: running")
	})
	poll("the metrics to report it", func() bool {
		m := httpGet("http://" + metrics + "/metrics")
		return strings.Contains(m, `syncloop_rule_ready{identity="",rule="secret-keys"} 0`) && strings.Contains(m, `syncloop_rule_ready{identity="",rule="fanout"} 1`) &&
			metricValue(m, `syncloop_watch_errors_total{reason="Forbidden",resource="secrets"}`) > 0 // there at 0 from the start
	})
}
