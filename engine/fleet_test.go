package engine

import (
	"context"
	"os"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// spreadRule: every ConfigMap labelled spread=yes in NS gets a copy in
// namespace default of each cluster of the inventory labelled env=prod.
const spreadRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: spread}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "spread=yes"}
  resources:
    - id: copy
      clusters: {selector: "cluster.labels.?env.orValue('') == 'prod'"}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy", namespace: default}
        data:
          k: ${object.data.k}
          cluster: ${cluster.name}
`

// workload is a cluster of a fleet test: a control plane of its own.
type workload struct {
	name string
	env  *testenv.Env
	cs   kubernetes.Interface
}

// startWorkloads starts a control plane for each name, at once, with its
// garbage collector.
func startWorkloads(t *testing.T, names ...string) []*workload {
	t.Helper()
	out := make([]*workload, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			// A cluster collects garbage: a foreground delete ends there.
			env, err := testenv.Start(t.Context(), testenv.Options{ControllerManager: true, Controllers: []string{"garbagecollector"}})
			if err != nil {
				errs[i] = err
				return
			}
			t.Cleanup(env.Stop)
			cs, err := kubernetes.NewForConfig(env.Config())
			out[i], errs[i] = &workload{name: name, env: env, cs: cs}, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// putCluster adds w to the inventory in h's namespace, as Cluster API
// writes a kubeconfig Secret, with labels.
func (h *harness) putCluster(w *workload, labels map[string]string) {
	h.t.Helper()
	kubeconfig, err := os.ReadFile(w.env.Kubeconfig())
	if err != nil {
		h.t.Fatal(err)
	}
	l := map[string]string{rules.LabelClusterName: w.name}
	for k, v := range labels {
		l[k] = v
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: w.name + "-kubeconfig", Labels: l}, Data: map[string][]byte{fleet.KubeconfigKey: kubeconfig}}
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(h.t.Context(), s, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// remoteCopy is the copy of trigger name in w, if there is one.
func (h *harness) remoteCopy(w *workload, name string) (*corev1.ConfigMap, bool) {
	cm, err := w.cs.CoreV1().ConfigMaps("default").Get(context.Background(), name+"-copy", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		return nil, false // not answering: not there as far as a test can tell
	}
	return cm, true
}

// copyHas reports whether the copy of name in w holds k.
func (h *harness) copyHas(w *workload, name, k string) bool {
	cm, ok := h.remoteCopy(w, name)
	return ok && cm.Data["k"] == k && cm.Data["cluster"] == w.name
}

// TestFleet: a rule's children go to the clusters of the inventory its
// selector picks, are repaired there, wait as they are while a cluster does
// not answer, stay when the cluster leaves the selection or the inventory,
// and go with their trigger — which is held until every cluster that may
// have its children answers.
//
// API server: three control planes; kubeconfig Secrets read as Cluster API
// writes them; watches and server-side apply in the workload clusters; one
// of them stopped and started.
func TestFleet(t *testing.T) {
	h := newHarness(t)
	ws := startWorkloads(t, "a", "b")
	a, b := ws[0], ws[1]
	inv := fleet.New(h.cs, h.ns, fleet.Options{})
	go inv.Run(t.Context())
	h.fleet = inv
	h.putCluster(a, map[string]string{"env": "prod"})
	h.putCluster(b, map[string]string{"env": "prod"})
	h.start(h.loadRules(spreadRule))

	h.createCM("web", map[string]string{"spread": "yes"}, map[string]string{"k": "v1"})
	h.eventually("a copy in each prod cluster", func() bool { return h.copyHas(a, "web", "v1") && h.copyHas(b, "web", "v1") })
	if _, ok := h.configMap("default", "web-copy"); ok {
		t.Fatal("a child that targets clusters was also made in syncloop's own cluster")
	}
	first, _ := h.remoteCopy(a, "web")

	// Drift in a workload cluster is seen there and repaired.
	cm := first.DeepCopy()
	cm.Data["k"] = "tampered"
	if _, err := a.cs.CoreV1().ConfigMaps("default").Update(t.Context(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the drift in cluster a to be repaired", func() bool { return h.copyHas(a, "web", "v1") })

	// a stops answering: b follows the trigger, a's copy waits as it is and
	// catches up when a answers again — it is never deleted.
	a.env.StopAPIServer()
	h.updateCM("web", func(cm *corev1.ConfigMap) { cm.Data["k"] = "v2" })
	h.eventually("cluster b to follow while a is down", func() bool { return h.copyHas(b, "web", "v2") })
	if err := a.env.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.eventuallyWithin(60e9, "cluster a to catch up once it answers", func() bool { return h.copyHas(a, "web", "v2") })
	if now, _ := h.remoteCopy(a, "web"); now.UID != first.UID {
		t.Fatalf("the copy in cluster a was made again (uid %s, was %s): it was deleted while a did not answer", now.UID, first.UID)
	}

	// b leaves the selection: its copy stays as it was (orphaned); a's
	// follows on.
	h.patchSecret(b.name+"-kubeconfig", `{"metadata":{"labels":{"env":"dev"}}}`)
	h.eventually("the inventory to see b relabelled", func() bool {
		for _, c := range inv.Clusters() {
			if c.Name == "b" {
				return c.Labels["env"] == "dev"
			}
		}
		return false
	})
	h.updateCM("web", func(cm *corev1.ConfigMap) { cm.Data["k"] = "v3" })
	h.eventually("cluster a to follow", func() bool { return h.copyHas(a, "web", "v3") })
	if !h.copyHas(b, "web", "v2") {
		t.Fatal("the copy in cluster b, which left the selection, was changed or deleted")
	}

	// b leaves the inventory: nothing of it is touched again.
	if err := h.cs.CoreV1().Secrets(h.ns).Delete(t.Context(), b.name+"-kubeconfig", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the inventory to drop b", func() bool { return len(inv.Clusters()) == 1 })

	// The trigger goes while a does not answer: it is held until a
	// answers, and its copy there goes with it.
	a.env.StopAPIServer()
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.env.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.eventuallyWithin(60e9, "the copy in cluster a to go with its trigger", func() bool {
		_, ok := h.remoteCopy(a, "web")
		_, err := a.cs.CoreV1().ConfigMaps("default").List(t.Context(), metav1.ListOptions{Limit: 1})
		return !ok && err == nil
	})
	h.eventually("the trigger to be let go", func() bool { _, ok := h.configMap(h.ns, "web"); return !ok })
	if !h.copyHas(b, "web", "v2") {
		t.Fatal("the copy in cluster b, no longer in the inventory, was deleted")
	}
}

// patchSecret merge-patches the Secret name in h's namespace.
func (h *harness) patchSecret(name, patch string) {
	h.t.Helper()
	if _, err := h.cs.CoreV1().Secrets(h.ns).Patch(h.t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}
