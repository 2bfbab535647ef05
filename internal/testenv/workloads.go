package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// KwokVersion is the kwok hack/testenv.sh builds (from hack/kwok).
const KwokVersion = "v0.8.0"

// schedulerBinary is kube-scheduler, built beside the control plane.
const schedulerBinary = "kube-scheduler"

// workloadControllers are the controllers that turn a Deployment into
// Pods (and the default ServiceAccount a Pod needs): with kube-scheduler and kwok, its Pods become Running and Ready
// and its availableReplicas means something.
var workloadControllers = []string{"deployment", "replicaset", "serviceaccount"}

// FakeNode is the Node kwok plays the kubelet of: Pods scheduled there
// become Running and Ready at once (kwok's default pod-fast stage).
const FakeNode = "kwok-node-0"

// Kwok returns the path of the kwok binary hack/testenv.sh builds.
func Kwok() (string, error) {
	p := filepath.Join(defaultCacheRoot(), "kwok-"+KwokVersion, "kwok")
	if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("kwok not found at %s: run hack/testenv.sh (or make test) to build it", p)
	}
	return p, nil
}

// startWorkloads starts kube-scheduler and kwok, and registers the fake
// Node kwok manages.
func (e *Env) startWorkloads(ctx context.Context, scheduler, kwok string) error {
	p, err := startProcess(e.dir, "kube-scheduler", scheduler,
		"--kubeconfig="+e.kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	)
	if err != nil {
		return err
	}
	e.workloads = append(e.workloads, p)
	if p, err = startProcess(e.dir, "kwok", kwok,
		"--kubeconfig="+e.kubeconfig,
		"--config="+filepath.Join(filepath.Dir(kwok), "stages.yaml"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--manage-nodes-with-label-selector=",
		"--manage-single-node=",
		"--cidr=10.0.0.0/24",
		"--node-ip=10.0.0.1",
		"--node-port=0",
		"--server-address=",
	); err != nil {
		return err
	}
	e.workloads = append(e.workloads, p)
	cs, err := kubernetes.NewForConfig(e.Config())
	if err != nil {
		return err
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("256Gi"), corev1.ResourcePods: resource.MustParse("1000"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: FakeNode, Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels: map[string]string{"kubernetes.io/hostname": FakeNode, "kubernetes.io/os": "linux", "type": "kwok"}},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The API server taints a new Node not-ready; the node lifecycle
	// controller, which would lift the taint once kwok reports the Node
	// Ready, is not run: the Node is made schedulable here.
	_, err = cs.CoreV1().Nodes().Patch(ctx, FakeNode, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{})
	return err
}
