package main

import (
	"encoding/json"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// spreadTraceRule: each ConfigMap labelled spread gets a copy in clusters
// here and away.
const spreadTraceRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: spread}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: spread}
  resources:
    - id: copy
      clusters: {names: [here, away]}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy", namespace: NS}
        data: {v: "${object.data.v}", cluster: "${cluster.name}"}
`

// TestTraceFleet: trace reads the fleet's kubeconfig Secrets and shows a
// trigger's children in each cluster — here (the test's own API server,
// as a workload cluster) its copy drifted while syncloop was away, away
// (nothing answers at its address) not reachable — and exits 3.
func TestTraceFleet(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "trace-fleet")
	kubeconfig, err := os.ReadFile(env.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	away := regexp.MustCompile(`server: \S+`).ReplaceAll(kubeconfig, []byte("server: https://127.0.0.1:1"))
	for name, value := range map[string][]byte{"here": kubeconfig, "away": away} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Labels: map[string]string{rules.LabelClusterName: name}},
			Data: map[string][]byte{fleet.KubeconfigKey: value}}
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	file := writeFile(t, t.TempDir(), "spread.yaml", strings.ReplaceAll(spreadTraceRule, "NS", ns))
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"spread": "yes"}},
		Data: map[string]string{"v": "1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stop := startSyncloop(t, "-f", file, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	pollUntil(t, 60*time.Second, "the copy in cluster here", func() bool {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "web-copy", metav1.GetOptions{})
		return err == nil && cm.Data["cluster"] == "here"
	})
	stop()
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "web-copy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["v"] = "edited"
	if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "someone"}); err != nil {
		t.Fatal(err)
	}

	args := []string{"trace", "configmap", "web", "-n", ns, "-f", file, "--clusters-namespace", ns, "--kubeconfig", env.Kubeconfig()}
	code, out, errOut := syncloop(t, args...)
	if code != 3 {
		t.Fatalf("trace of a trigger whose cluster does not answer exited %d, want 3: %s%s", code, out, errOut)
	}
	for _, want := range []string{
		"ConfigMap/web-copy (" + ns + ", in cluster here)",
		"Drifted: data.v differs from the rule",
		"ConfigMap/web-copy (" + ns + ", in cluster away)",
		`Unreachable: cluster "away" is not reachable`,
		`cluster "away" is not reachable`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "token") || strings.Contains(out, "certificate-authority-data") {
		t.Errorf("trace printed a kubeconfig:\n%s", out)
	}

	code, out, _ = syncloop(t, append(args, "-o", "json")...)
	var rep manager.TraceReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 3 {
		t.Fatalf("trace -o json exited %d: %v\n%s", code, err, out)
	}
	children := rep.Rules[0].Resources[0].Children
	if len(children) != 2 || children[0].Cluster != "away" || children[0].Unreachable == "" ||
		children[1].Cluster != "here" || !children[1].Exists || children[1].Synced || rep.Rules[0].Reason != "ClusterUnreachable" {
		t.Errorf("children %+v, reason %q: want the copy in away not reachable, the one in here drifted, and Ready ClusterUnreachable", children, rep.Rules[0].Reason)
	}
}

// TestTraceFleetRollout: a trigger on the new revision of a rollout by
// cluster halted at its first step is traced as the engine works it: its
// child in the canary cluster compared with the new revision, the one in
// the cluster not reached yet as the previous revision left it —
// RolloutPending, not drifted — and Ready says so.
func TestTraceFleetRollout(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "trace-rollout")
	mainCS := fleetOfTwo(t, env, cs, ns)
	rule := func(v string) string {
		return strings.NewReplacer("@NS@", ns, "@V@", v).Replace(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: staged}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: @NS@, labelSelector: staged}
  resources:
    - id: copy
      clusters: {selector: "true"}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${cluster.name}", namespace: @NS@}
        data: {v: "@V@"}
  rollout:
    strategy: Progressive
    clusters: [{selector: "cluster.name == 'canary'"}]
`)
	}
	file := writeFile(t, t.TempDir(), "staged.yaml", rule("1"))
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"staged": "yes"}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	stop := startSyncloop(t, "-f", file, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns, "--clusters-namespace", ns)
	pollUntil(t, 60*time.Second, "the copies in both clusters", func() bool {
		n := 0
		for c, client := range map[string]kubernetes.Interface{"canary": cs, "main": mainCS} {
			if cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "web-"+c, metav1.GetOptions{}); err == nil && cm.Data["v"] == "1" {
				n++
			}
		}
		return n == 2
	})
	stop()

	// Revision 2, as a rollout that reached the canary and halted there
	// records it.
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	next, err := l.Parse(file, []byte(rule("2")))
	if err != nil {
		t.Fatal(err)
	}
	r := next.Rules[0]
	rec, err := json.Marshal(rollout.Record{From: "previous", To: r.Hash, State: rollout.Halted, Step: 1, Steps: 2,
		Threshold: math.MaxUint64, Started: time.Now().Add(-time.Minute).Truncate(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().ControllerRevisions(ns).Create(ctx, &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: "staged-" + r.Hash[:10],
		Labels:      map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "staged"},
		Annotations: map[string]string{rules.AnnotationRuleHash: r.Hash, rules.AnnotationRollout: string(rec)}},
		Data: runtime.RawExtension{Raw: r.Source}, Revision: 2}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	args := []string{"trace", "configmap", "web", "-n", ns, "--syncloop-namespace", ns, "--clusters-namespace", ns, "--kubeconfig", env.Kubeconfig()}
	code, out, errOut := syncloop(t, args...)
	if code != 3 {
		t.Fatalf("trace of a trigger a rollout holds back exited %d, want 3 (not ready): %s%s", code, out, errOut)
	}
	for _, want := range []string{
		"ConfigMap/web-canary (" + ns + ", in cluster canary)",
		"Drifted: applied from another version of the rule",
		`RolloutPending: the rollout of the rule's new revision has not reached cluster "main" yet`,
		"ConfigMap/web-main (" + ns + ", in cluster main)",
		"RolloutPending: revision " + r.Hash[:10] + " reaches it at step 2 of 2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = syncloop(t, append(args, "-o", "json")...)
	var rep manager.TraceReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 3 || len(rep.Rules) != 1 || len(rep.Rules[0].Resources) != 1 {
		t.Fatalf("trace -o json exited %d: %v\n%s", code, err, out)
	}
	for _, ch := range rep.Rules[0].Resources[0].Children {
		if held := ch.Held != ""; held != (ch.Cluster == "main") || held && (!ch.Exists || ch.Drift != "") {
			t.Errorf("child %s in %s: held %q, exists %v, drift %q; want only main's held, as it is", ch.Name, ch.Cluster, ch.Held, ch.Exists, ch.Drift)
		}
	}
}
