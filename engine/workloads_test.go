package engine

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules/render"
)

// The tests here run Deployments whose Pods become Ready: the package's
// control plane has Workloads (kube-scheduler, the deployment and
// replicaset controllers, and kwok's fake Node).

// rolledOut is a Deployment's readyWhen as `kubectl rollout status` judges
// one: the controller has seen its generation, every replica runs the
// current template, and no other replica is left.
const rolledOut = `
      readyWhen:
        - "self.?status.?observedGeneration.orValue(0) >= self.metadata.generation"
        - "self.?status.?updatedReplicas.orValue(0) == self.spec.replicas"
        - "self.?status.?replicas.orValue(0) == self.spec.replicas"
        - "self.?status.?availableReplicas.orValue(0) == self.spec.replicas"`

// deploymentTemplate is a Deployment named after the trigger, with
// replicas and a Pod template annotated version.
func deploymentTemplate(replicas, version string) string {
	return fmt.Sprintf(`
      template:
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: "${object.metadata.name}"}
        spec:
          replicas: %s
          selector: {matchLabels: {app: "${object.metadata.name}"}}
          template:
            metadata:
              labels: {app: "${object.metadata.name}"}
              annotations: {version: "%s"}
            spec:
              containers: [{name: app, image: "registry.example/app:1"}]`, replicas, version)
}

// TestGraphDeploymentReadiness: a resource that reads a Deployment waits
// until the Deployment's Pods are available, as the deployment controller
// and the (kwok) kubelet report them; so does the trigger's Ready
// condition; scaling the Deployment makes both wait again.
//
// API server: a Deployment's status written by kube-controller-manager
// from Pods kwok runs, read as readyWhen.
func TestGraphDeploymentReadiness(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: deploy}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  resources:
    - id: deployment` + rolledOut + deploymentTemplate("${object.spec.replicas}", "1") + `
    - id: summary
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-summary"}
        data: {available: "${string(children.deployment.status.availableReplicas)}"}
  status:
    available: ${ready.deployment}
`))
	h.createWidget("web", map[string]any{"replicas": int64(2)})
	summary := func() string {
		cm, ok := h.configMap(h.ns, "web-summary")
		if !ok {
			return ""
		}
		return cm.Data["available"]
	}
	ready := func() (status, reason string) {
		c := readyCondition(h.widget("web"))
		if c == nil {
			return "", ""
		}
		return fmt.Sprint(c["status"]), fmt.Sprint(c["reason"])
	}

	// While the Pods start: the Deployment, not ready; no summary yet.
	h.eventually("Ready False while the Pods start", func() bool { s, r := ready(); return s == "False" && r == render.ReasonWaitingFor+"Deployment" })
	if got := summary(); got != "" {
		t.Fatalf("the summary was applied before the Deployment was available (available %q)", got)
	}
	h.eventuallyWithin(90*time.Second, "the Deployment available, the summary and Ready True", func() bool {
		s, _ := ready()
		return summary() == "2" && s == "True"
	})

	// Scaled to 3: not ready until the third Pod is; the summary follows
	// once it is.
	if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Patch(t.Context(), "web", types.MergePatchType,
		[]byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventuallyWithin(90*time.Second, "3 available, in the summary, and Ready True", func() bool {
		s, _ := ready()
		return summary() == "3" && s == "True"
	})
	d, err := h.cs.AppsV1().Deployments(h.ns).Get(t.Context(), "web", metav1.GetOptions{})
	if err != nil || d.Status.AvailableReplicas != 3 {
		t.Fatalf("Deployment %v, %v: want 3 available", d.Status, err)
	}
}

// TestRolloutDeploymentReadiness: a rule change that changes Deployments'
// Pod templates rolls out one trigger at a time, and each step waits
// until the Deployments of the step before have rolled — every replica
// on the new template and available, as the deployment controller
// reports it. The order is read from one watch of the Deployments, in
// etcd's order.
//
// API server: Deployments rolling under kube-controller-manager and kwok,
// gating a syncloop rollout.
func TestRolloutDeploymentReadiness(t *testing.T) {
	h := newHarness(t)
	rule := func(version string) string {
		return `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: deploy-roll}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "rollout=deploy"}
  rollout: {step: 1, progressDeadline: 5m}
  resources:
    - id: deployment` + rolledOut + deploymentTemplate("2", version) + "\n"
	}
	v1 := h.loadRules(rule("v1"))
	store := newMemRollouts(v1.Get("deploy-roll"))
	h.rollouts = store
	const n = 3
	for i := range n {
		h.createCM(fmt.Sprintf("app%d", i), map[string]string{"rollout": "deploy"}, nil)
	}
	h.start(v1)
	list := func() *appsv1.DeploymentList {
		l, err := h.cs.AppsV1().Deployments(h.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	h.eventuallyWithin(90*time.Second, "every Deployment rolled out at v1", func() bool {
		l := list()
		return len(l.Items) == n && !slices.ContainsFunc(l.Items, func(d appsv1.Deployment) bool { return !deploymentRolled(&d, "v1") })
	})

	w, err := h.cs.AppsV1().Deployments(h.ns).Watch(t.Context(), metav1.ListOptions{ResourceVersion: list().ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	h.updates <- h.loadRules(rule("v2"))
	// The index in the watch of each Deployment's first event at v2, and
	// of the first at v2 and rolled.
	moved, rolled := map[string]int{}, map[string]int{}
	deadline := time.After(3 * time.Minute)
	for i := 0; len(rolled) < n; i++ {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-deadline:
			t.Fatalf("not every Deployment rolled to v2 in 3 minutes: moved %v, rolled %v, rollout %+v", moved, rolled, store.get("deploy-roll"))
		}
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			t.Fatalf("watch: %v", ev.Object)
		}
		if _, seen := moved[d.Name]; !seen && d.Spec.Template.Annotations["version"] == "v2" {
			moved[d.Name] = i
		}
		if _, seen := rolled[d.Name]; !seen && deploymentRolled(d, "v2") {
			rolled[d.Name] = i
		}
	}
	order := make([]string, 0, n)
	for name := range moved {
		order = append(order, name)
	}
	slices.SortFunc(order, func(a, b string) int { return moved[a] - moved[b] })
	for k := 1; k < len(order); k++ {
		prev, next := order[k-1], order[k]
		if rolled[prev] > moved[next] {
			t.Errorf("step %d moved %s (event %d) before %s of the step before had rolled (event %d)", k+1, next, moved[next], prev, rolled[prev])
		}
	}
	h.eventually("the rollout complete", func() bool { return store.get("deploy-roll").State == rollout.Complete })
	if rec := store.get("deploy-roll"); rec.Steps != n || rec.Moved != n {
		t.Errorf("rollout %+v: want %d steps, all moved", rec, n)
	}
	if said := store.said("RolloutStep"); len(said) < n-1 || !strings.Contains(strings.Join(said, "\n"), "step 2 of 3") {
		t.Errorf("rollout steps said: %q", said)
	}
}

// deploymentRolled is rolledOut, on d at Pod template version.
func deploymentRolled(d *appsv1.Deployment, version string) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return d.Spec.Template.Annotations["version"] == version && d.Status.ObservedGeneration >= d.Generation &&
		d.Status.UpdatedReplicas == want && d.Status.Replicas == want && d.Status.AvailableReplicas == want
}
