package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

const (
	tenantRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: app}
  lookups:
    - {id: creds, apiVersion: v1, kind: Secret, name: creds}
  resources:
    - id: settings
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-settings", namespace: "${object.?data.ns.orValue(object.metadata.namespace)}"}
        data: {secret: "${lookups.creds.metadata.name}"}
`
	tenantEscapes = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: escapes}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: app}
  lookups:
    - {id: creds, apiVersion: v1, kind: Secret, namespace: team-b, name: creds}
  resources:
    - id: settings
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: team-b}}
`
	tenantObjects = `apiVersion: v1
kind: ConfigMap
metadata: {name: web, namespace: team-a, labels: {app: web}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: sly, namespace: team-a, labels: {app: sly}}
data: {ns: team-b}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: other, namespace: team-b, labels: {app: other}}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: team-a}
`
	tenantTest = `apiVersion: syncloop.dev/v1alpha1
kind: Test
metadata: {name: app}
rules: [rules.yaml]
objects: [objects.yaml]
expect:
  - rule: app
    trigger: {kind: ConfigMap, name: web, namespace: team-a}
    children:
      - {apiVersion: v1, kind: ConfigMap, metadata: {name: web-settings, namespace: team-a, labels: {syncloop.dev/rule: team-a.app}}, data: {secret: creds}}
  - rule: app
    trigger: {kind: ConfigMap, name: sly, namespace: team-a}
    error: 'stays in it: rendered "team-b"'
`
)

// TestTenantOffline: --tenant checks a team's rules as syncloop would
// read them from a ConfigMap in that namespace, without a cluster.
// validate rejects a lookup and a child in another namespace with their
// file:line:col (the same file as a platform rule is valid); render names
// the rule <namespace>.<name>, watches only the namespace and refuses per
// trigger a child whose namespace a trigger's field sends elsewhere; test
// names the rule as the file does.
func TestTenantOffline(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "rules.yaml", tenantRule)
	bad := writeFile(t, t.TempDir(), "escapes.yaml", tenantEscapes)
	objects := writeFile(t, dir, "objects.yaml", tenantObjects)
	writeFile(t, dir, "test.yaml", tenantTest)

	if code, out, errOut := syncloop(t, "validate", "--tenant", "team-a", "-f", good); code != 0 || out != "1 rule(s) in 1 file(s) valid\n" {
		t.Errorf("validate --tenant of a confined rule: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut := syncloop(t, "validate", "--tenant", "team-a", "-f", bad)
	for _, want := range []string{
		bad + `:7:60: rule "escapes": spec.lookups[0].namespace: a tenant rule of namespace "team-a" stays in it: it cannot read namespace "team-b"`,
		bad + `:10:82: rule "escapes": spec.resources[0].template.metadata.namespace: a tenant rule of namespace "team-a" stays in it: it cannot make or patch objects in namespace "team-b"`,
	} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("validate --tenant of a rule leaving its namespace: exit %d, want 1 and %q in\n%s", code, want, errOut)
		}
	}
	if code, out, errOut := syncloop(t, "validate", "-f", bad); code != 0 {
		t.Errorf("validate of the same rule as a platform rule: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut := syncloop(t, "render", "--tenant", "team-a", "-f", good, "--objects", objects)
	if code != 1 || !strings.Contains(out, "name: web-settings") || !strings.Contains(out, "syncloop.dev/rule: team-a.app") ||
		strings.Contains(out, "other-settings") || !strings.Contains(errOut, `a tenant rule of namespace "team-a" stays in it: rendered "team-b"`) {
		t.Errorf("render --tenant: exit %d, want 1 with web's child, not other's, and sly refused\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if code, out, errOut := syncloop(t, "test", "--tenant", "team-a", filepath.Join(dir, "test.yaml")); code != 0 || !strings.Contains(out, "1 test(s): 1 passed") {
		t.Errorf("test --tenant: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, _ := syncloop(t, "test", filepath.Join(dir, "test.yaml")); code != 1 {
		t.Errorf("the tenant's test as a platform rule's: exit %d, want 1 (the child is not confined)\n%s", code, out)
	}
}

// TestTenantRules: with --tenant-rules, a team's ConfigMap labelled
// syncloop.dev/rules: "true" in its namespace is a rule source. Its rule
// runs as the namespace's default ServiceAccount, whose only rights are a
// Role there, end to end; an edit reloads it; a version that reads another
// namespace's Secret is refused at load with a Warning Event on the
// ConfigMap naming file:line:col (its last good version stays in force), a
// Normal Event once it loads again; a tenant rule that cannot run does not
// make the replica unready; deleting the ConfigMap removes its rule and
// leaves its children.
func TestTenantRules(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "team")
	grantConfigMaps(t, cs, ns, "default")
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rulesCM := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "team-rules", Labels: map[string]string{"syncloop.dev/rules": "true"}},
		Data: map[string]string{"app.yaml": tenantRule}}
	if rulesCM, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, rulesCM, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // the platform's rules: none
	args := []string{"-f", dir, "--kubeconfig", env.Kubeconfig(), "--tenant-rules"}
	_, probes, stop := startInProcess(t, args...)
	t.Cleanup(func() { stop() })
	readyz, poll := probing(t, probes, 60*time.Second)
	name := ns + ".app"
	settings := func() *corev1.ConfigMap {
		cm, _ := cs.CoreV1().ConfigMaps(ns).Get(ctx, "web-settings", metav1.GetOptions{})
		return cm
	}
	poll("the tenant rule's child, made as the namespace's default ServiceAccount", func() bool {
		cm := settings()
		return cm != nil && cm.Data["secret"] == "creds" && cm.Labels["syncloop.dev/rule"] == name &&
			strings.Contains(readyz(), "rule "+name+": running as "+ns+"/default\n")
	})

	edit := func(text string) {
		t.Helper()
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "team-rules", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["app.yaml"] = text
		if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	events := func(reason, text string) bool {
		list, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.InvolvedObject.Name == "team-rules" && e.InvolvedObject.UID == rulesCM.UID && strings.Contains(e.Message, text) {
				return true
			}
		}
		return false
	}
	edit(strings.Replace(tenantRule, `data: {secret: "${lookups.creds.metadata.name}"}`, `data: {secret: "${lookups.creds.metadata.name}", v: "2"}`, 1))
	poll("the edit reloaded", func() bool { cm := settings(); return cm != nil && cm.Data["v"] == "2" })

	// Changed while syncloop is down: the restarted syncloop rolls it out
	// from the revision it recorded, compiled as the tenant rule it was.
	stop()
	edit(strings.Replace(tenantRule, `data: {secret: "${lookups.creds.metadata.name}"}`, `data: {secret: "${lookups.creds.metadata.name}", v: "3"}`, 1))
	_, probes, stop = startInProcess(t, args...)
	readyz, poll = probing(t, probes, 60*time.Second)
	poll("the change rolled out from the recorded revision", func() bool {
		cm := settings()
		return cm != nil && cm.Data["v"] == "3" && strings.Contains(readyz(), "rollout "+name+": Complete")
	})

	edit(strings.Replace(tenantRule, "name: creds}", "namespace: kube-system, name: creds}", 1))
	want := "configmap:" + ns + `/team-rules/app.yaml:7:60: rule "app": spec.lookups[0].namespace: a tenant rule of namespace "` + ns + `" stays in it: it cannot read namespace "kube-system"`
	poll("a Warning Event on the ConfigMap with file:line:col", func() bool { return events("RuleFileNotLoaded", want) })
	if !strings.Contains(readyz(), "rule "+name+": running") {
		t.Errorf("the last good version is not in force:\n%s", readyz())
	}
	edit(strings.Replace(tenantRule, "spec:\n", "spec:\n  serviceAccountName: nobody\n", 1))
	poll("a Normal Event once it loads, and the rule waiting as a ServiceAccount without rights", func() bool {
		r := readyz()
		return events("RulesLoaded", "loads again") && strings.Contains(r, "rule "+name+": syncing as "+ns+"/nobody: ")
	})
	if resp, err := http.Get("http://" + probes + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("a tenant rule that cannot run made the replica unready: %v %v", err, resp)
	} else {
		resp.Body.Close()
	}

	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "team-rules", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the tenant rule removed", func() bool { return !strings.Contains(readyz(), "rule "+name) })
	if settings() == nil {
		t.Error("removing the tenant's rule deleted its child")
	}
}
