package main

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// notesRule makes a ConfigMap and a Secret per trigger; readerRule acts as
// a ServiceAccount of its own, nobody.
const (
	notesRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: notes}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: notes=yes}
  resources:
    - id: note
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-note"}}
    - id: secret
      template: {apiVersion: v1, kind: Secret, metadata: {name: "${object.metadata.name}-secret"}, stringData: {k: v}}
`
	readerRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: reader}
spec:
  serviceAccountName: nobody
  serviceAccountNamespace: NS
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: notes=yes}
  resources:
    - id: note
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-read"}}
`
)

// TestIdentityCommands: with --default-service-account, plan and run act
// as that ServiceAccount — which may manage ConfigMaps and only read
// Secrets in one namespace. plan shows the ConfigMap it would create and
// the Secret write the ServiceAccount may not do as forbidden; run makes
// the ConfigMap, reports the refused Secret as a Failed Event on the
// trigger, and names each rule's identity in /readyz and
// syncloop_rule_ready — a rule naming a ServiceAccount of its own without
// rights waits there with the API server's refusal.
func TestIdentityCommands(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "identity")
	for _, name := range []string{"writer", "nobody"} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	grantConfigMaps(t, cs, ns, "writer")
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"notes": "yes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	notes := writeFile(t, dir, "notes.yaml", strings.ReplaceAll(notesRule, "NS", ns))
	readerDir := t.TempDir()
	reader := writeFile(t, readerDir, "reader.yaml", strings.ReplaceAll(readerRule, "NS", ns))
	writer := ns + "/writer"
	refused := `User "system:serviceaccount:` + ns + `:writer" cannot patch resource "secrets"`

	code, out, errOut := syncloop(t, "plan", "-f", notes, "--kubeconfig", env.Kubeconfig(), "--default-service-account", writer)
	if code != 1 || !strings.Contains(out, "+ create  v1 ConfigMap "+ns+"/t-note") || !strings.Contains(out+errOut, refused) {
		t.Errorf("plan as %s: exit %d, want 1 with the ConfigMap created and the Secret refused (%s)\nstdout:\n%s\nstderr:\n%s", writer, code, refused, out, errOut)
	}
	if strings.Contains(out, "Secret "+ns+"/t-secret") && !strings.Contains(out+errOut, "forbidden") {
		t.Errorf("plan shows the Secret as a change the ServiceAccount may make:\n%s", out)
	}
	code, _, errOut = syncloop(t, "plan", "-f", reader, "--kubeconfig", env.Kubeconfig())
	if code != 1 || !strings.Contains(errOut, `rule "reader"`) || !strings.Contains(errOut, `User "system:serviceaccount:`+ns+`:nobody" cannot list resource "configmaps"`) {
		t.Errorf("plan of a rule whose ServiceAccount may not list: exit %d, stderr:\n%s", code, errOut)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-note", metav1.GetOptions{}); err == nil {
		t.Fatal("plan wrote")
	}

	writeFile(t, dir, "reader.yaml", strings.ReplaceAll(readerRule, "NS", ns))
	metrics, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig(), "--default-service-account", writer)
	readyz, poll := probing(t, probes, 60*time.Second)
	poll("notes running as the writer, reader waiting as nobody", func() bool {
		r := readyz()
		return strings.Contains(r, "rule notes: running as "+writer+"\n") &&
			strings.Contains(r, "rule reader: syncing as "+ns+"/nobody: ") && strings.Contains(r, `User "system:serviceaccount:`+ns+`:nobody" cannot list resource "configmaps"`)
	})
	poll("the note ConfigMap and a Failed Event for the refused Secret", func() bool {
		if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-note", metav1.GetOptions{}); err != nil {
			return false
		}
		events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range events.Items {
			if e.Reason == "Failed" && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Name == "t" && strings.Contains(e.Message, refused) {
				return true
			}
		}
		return false
	})
	if _, err := cs.CoreV1().Secrets(ns).Get(ctx, "t-secret", metav1.GetOptions{}); err == nil {
		t.Error("the Secret the ServiceAccount may not write exists")
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-read", metav1.GetOptions{}); err == nil {
		t.Error("the rule of a ServiceAccount without rights made its child")
	}
	m := httpGet("http://" + metrics + "/metrics")
	for _, want := range []string{`syncloop_rule_ready{identity="` + writer + `",rule="notes"} 1`, `syncloop_rule_ready{identity="` + ns + `/nobody",rule="reader"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "syncloop_rule_ready"))
		}
	}
}
