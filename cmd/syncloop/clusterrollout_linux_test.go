package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// stagedRule: every ConfigMap labelled staged in @NS@ gets a copy in
// every cluster of the fleet, holding @V@; with @READY@ set, a copy is
// ready once its test/ready annotation holds it. @ROLLOUT@ is
// spec.rollout.
const stagedRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: staged}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: @NS@, labelSelector: staged}
  rollout: @ROLLOUT@
  resources:
    - id: copy
      clusters: {selector: "true"}
      readyWhen: ["'@READY@' == '' || self.metadata.?annotations[?'test/ready'].orValue('') == '@READY@'"]
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy", namespace: @NS@}
        data: {v: "@V@"}
`

// TestRolloutShardedByCluster: two replicas share the triggers of a rule
// whose children go to two clusters; a change rolling out canary first
// brings every trigger's child in canary to the new revision — whichever
// replica owns the trigger — and main only once the coordinating
// replica sees, in its caches of canary, every one of them ready: its own
// share's and the other replica's.
func TestRolloutShardedByCluster(t *testing.T) {
	sc := newShardCluster(t)
	sc.rule = "staged"
	ctx := t.Context()
	clusters := map[string]kubernetes.Interface{"canary": sc.cs, "main": fleetOfTwo(t, sc.env, sc.cs, sc.ns)}
	rule := func(v, ready, rollout string) string {
		return strings.NewReplacer("@NS@", sc.ns, "@V@", v, "@READY@", ready, "@ROLLOUT@", rollout).Replace(stagedRule)
	}
	writeFile(t, sc.dir, "rules.yaml", rule("v1", "", "{strategy: Immediate}"))
	const n = 20
	for i := range n {
		if _, err := sc.cs.CoreV1().ConfigMaps(sc.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%02d", i),
			Labels: map[string]string{"staged": "yes"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// at are the copies in cluster holding v.
	at := func(cluster, v string) []string {
		list, err := clusters[cluster].CoreV1().ConfigMaps(sc.ns).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=staged"})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, cm := range list.Items {
			if cm.Data["v"] == v {
				out = append(out, cm.Name)
			}
		}
		return out
	}
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 90*time.Second, what, cond) }
	sc.start("a")
	sc.start("b")
	sc.readyWith("a", "b")
	poll("every copy at v1 in both clusters", func() bool { return len(at("canary", "v1")) == n && len(at("main", "v1")) == n })
	shares := func() string {
		var out []string
		for name, r := range sc.replicas {
			page := httpGet("http://" + r.metrics + "/metrics")
			out = append(out, fmt.Sprintf("%s: %v", name, metricValue(page, `syncloop_shard_cached_objects{rule="staged"}`)))
		}
		return strings.Join(out, ", ")
	}
	t.Logf("cached shares: %s", shares())

	writeFile(t, sc.dir, "rules.yaml", rule("v2", "v2", "{strategy: Progressive, progressDeadline: 1h, clusters: [{selector: \"cluster.name == 'canary'\"}]}"))
	poll("every copy in canary at v2", func() bool { return len(at("canary", "v2")) == n })
	if got := at("main", "v2"); len(got) != 0 {
		t.Fatalf("copies in main at v2 before canary's are ready: %v", got)
	}
	canary := at("canary", "v2")
	markReady(t, sc.cs.CoreV1().ConfigMaps(sc.ns), "v2", canary[:n-1])
	// All but one ready: the step waits for the last, whichever replica
	// owns it. The replica that steps the rollout says how many of the
	// step it judged healthy, its own and the other's.
	poll("the coordinator to judge 19 of the 20 healthy", func() bool {
		return strings.Contains(httpGet("http://"+sc.replicas["a"].probes+"/readyz")+httpGet("http://"+sc.replicas["b"].probes+"/readyz"),
			fmt.Sprintf("step 1 of 2, %d triggers on revision", n)) &&
			strings.Contains(httpGet("http://"+sc.replicas["a"].probes+"/readyz")+httpGet("http://"+sc.replicas["b"].probes+"/readyz"),
				fmt.Sprintf("%d of the step's %d healthy", n-1, n))
	})
	if got := at("main", "v2"); len(got) != 0 {
		t.Fatalf("copies in main at v2 with %s in canary not ready: %v", canary[n-1], got)
	}
	markReady(t, sc.cs.CoreV1().ConfigMaps(sc.ns), "v2", canary[n-1:])
	poll("every copy in main at v2", func() bool { return len(at("main", "v2")) == n })
}

// fleetOfTwo makes a fleet of two clusters for the rules of ns: canary,
// the test's API server (env, cs), and main, a control plane of its own
// (two Secrets of one API server are one cluster), each a kubeconfig
// Secret in ns, and ns in main too. It returns main's clientset.
func fleetOfTwo(t *testing.T, env *testenv.Env, cs kubernetes.Interface, ns string) kubernetes.Interface {
	t.Helper()
	ctx := t.Context()
	mainEnv, err := testenv.Start(ctx, testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mainEnv.Stop)
	mainCS := kubernetes.NewForConfigOrDie(mainEnv.Config())
	if _, err := mainCS.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, kc := range map[string]string{"canary": env.Kubeconfig(), "main": mainEnv.Kubeconfig()} {
		kubeconfig, err := os.ReadFile(kc)
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubeconfig", Labels: map[string]string{rules.LabelClusterName: name}},
			Data: map[string][]byte{fleet.KubeconfigKey: kubeconfig}}
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return mainCS
}
