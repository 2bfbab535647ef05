package testenv

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// TestWorkloads: with Options.Workloads a Deployment gets Pods, scheduled
// onto the fake Node, Running and Ready, and becomes available; Stop ends
// kube-scheduler and kwok too.
func TestWorkloads(t *testing.T) {
	Get(t) // the binaries are there
	env, err := Start(t.Context(), Options{Workloads: true})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	cs, _, ns := clients(t, env)
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web:1"}}}}},
	}
	if _, err := cs.AppsV1().Deployments(ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *appsv1.Deployment
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err = cs.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && got.Status.AvailableReplicas == 2 && got.Status.ObservedGeneration == got.Generation, nil
	})
	if err != nil {
		pods, _ := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		for _, p := range pods.Items {
			t.Logf("Pod %s: node %q phase %s conditions %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions)
		}
		t.Fatalf("the Deployment did not become available: status %+v", got.Status)
	}
	pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d Pods, want 2", len(pods.Items))
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != FakeNode || p.Status.Phase != corev1.PodRunning {
			t.Errorf("Pod %s: node %q phase %s, want %s Running", p.Name, p.Spec.NodeName, p.Status.Phase, FakeNode)
		}
	}
	var pids []int
	for _, p := range env.workloads {
		pids = append(pids, p.cmd.Process.Pid)
	}
	env.Stop()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d (kube-scheduler or kwok) still running after Stop", pid)
		}
	}
}
