package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

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

// moveRule: every Widget of NS gets a copy in each cluster labelled with
// its spec.env; a cluster it leaves loses its copy (onLeave: Delete),
// within maxPrunes (MAXPRUNES) of the rule's children there.
const moveRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: move}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  rollout: {maxPrunes: MAXPRUNES}
  resources:
    - id: moved
      clusters:
        selector: "cluster.labels.?env.orValue('') == object.spec.env"
        onLeave: Delete
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-moved", namespace: default}
        data: {env: "${object.spec.env}"}
  status:
    env: ${object.spec.env}
    clusters: ${clusters}
`

// fleetRules are spreadRule and moveRule, the latter with maxPrunes.
func (h *harness) fleetRules(maxPrunes string) *rules.Set {
	h.t.Helper()
	return h.loadRules(spreadRule + "---\n" + strings.Replace(moveRule, "MAXPRUNES", maxPrunes, 1))
}

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

// runInventory runs the cluster inventory of h's namespace, the engine's
// fleet once h starts; counted: the clusters' clients' requests are
// counted with h's own.
func (h *harness) runInventory(counted bool) *fleet.Inventory {
	var o fleet.Options
	if counted {
		o.Configure = func(cfg *rest.Config) { *cfg = *h.counter.Wrap(cfg) }
	}
	inv := fleet.New(h.cs, h.ns, o)
	go inv.Run(h.t.Context())
	h.fleet = inv
	return inv
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

// moved is the uid of the copy of Widget name in w; "" when there is none.
func (h *harness) moved(w *workload, name string) types.UID {
	cm, err := w.cs.CoreV1().ConfigMaps("default").Get(context.Background(), name+"-moved", metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.UID
}

// clusterStates are a status's clusters as name:ready:reason.
func clusterStates(clusters []any) []string {
	var out []string
	for _, c := range clusters {
		if m, ok := c.(map[string]any); ok {
			out = append(out, fmt.Sprintf("%v:%v:%v", m["name"], m["ready"], m["reason"]))
		}
	}
	return out
}

// setEnv sets Widget name's spec.env.
func (h *harness) setEnv(name, env string) {
	h.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"env":%q}}`, env)
	if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Patch(h.t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// copyHas reports whether the copy of name in w holds k.
func (h *harness) copyHas(w *workload, name, k string) bool {
	cm, ok := h.remoteCopy(w, name)
	return ok && cm.Data["k"] == k && cm.Data["cluster"] == w.name
}

// TestFleet: a rule's children go to the clusters of the inventory its
// selector picks, are repaired there, wait as they are while a cluster does
// not answer — for a minute — and stay when the cluster leaves the
// selection or the inventory, unless the rule says onLeave: Delete: then
// a trigger that moves takes its children along, while a cluster that
// many triggers leave at once keeps them until maxPrunes is raised. They
// go with their trigger — which is held until every cluster that may
// have its children answers.
//
// API server: three control planes; kubeconfig Secrets read as Cluster API
// writes them; watches and server-side apply in the workload clusters; one
// of them stopped for a minute and started, and stopped again.
func TestFleet(t *testing.T) {
	h := newHarness(t)
	ws := startWorkloads(t, "a", "b")
	a, b := ws[0], ws[1]
	inv := h.runInventory(false)
	h.installWidgets()
	h.putCluster(a, map[string]string{"env": "prod"})
	h.putCluster(b, map[string]string{"env": "prod"})
	h.start(h.fleetRules("10%"))

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

	widgetNames := []string{"m0", "m1", "m2"}
	for _, name := range widgetNames {
		h.createWidget(name, map[string]any{"env": "prod"})
	}
	uids := map[string]types.UID{}
	h.eventually("each widget's copy in both prod clusters", func() bool {
		for _, name := range widgetNames {
			for _, w := range ws {
				if uids[w.name+"/"+name] = h.moved(w, name); uids[w.name+"/"+name] == "" {
					return false
				}
			}
		}
		return true
	})

	// a stops answering for a minute: b follows the triggers, a's children
	// wait as they are, Ready names a, and a catches up when it answers
	// again — nothing there is deleted or made again.
	stopped := time.Now()
	a.env.StopAPIServer()
	h.updateCM("web", func(cm *corev1.ConfigMap) { cm.Data["k"] = "v2" })
	h.eventually("cluster b to follow while a is down", func() bool { return h.copyHas(b, "web", "v2") })
	h.setEnv("m0", "dev") // m0 leaves both clusters: 1 of 3 children there, within 10%
	h.eventually("m0's copy to leave b while a is down", func() bool { return h.moved(b, "m0") == "" })
	h.eventually("m1's Ready to name cluster a, and its status to say what is where", func() bool {
		m1 := h.widget("m1")
		c := readyCondition(m1)
		clusters, _, _ := unstructured.NestedSlice(m1.Object, "status", "clusters")
		return c != nil && c["status"] == "False" && c["reason"] == "ClusterUnreachable" && strings.Contains(fmt.Sprint(c["message"]), `cluster "a" not reachable`) &&
			fmt.Sprint(clusterStates(clusters)) == "[a:false:ClusterUnreachable b:true:<nil>]"
	})
	time.Sleep(time.Until(stopped.Add(time.Minute))) // the outage's length, not a wait for a condition
	for _, name := range []string{"m1", "m2"} {
		if h.moved(b, name) != uids["b/"+name] {
			t.Fatalf("%s's copy in cluster b was deleted or made again while cluster a did not answer", name)
		}
	}
	if err := a.env.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A control plane back from an outage has its controllers restarted
	// too (kubelet restarts its static Pods): a's garbage collector, which
	// a foreground delete there waits for, does not always find its way
	// back after a minute without an API server.
	if err := a.env.RestartControllerManager(); err != nil {
		t.Fatal(err)
	}
	h.eventuallyWithin(60*time.Second, "cluster a to catch up once it answers", func() bool {
		return h.copyHas(a, "web", "v2") && h.moved(a, "m0") == ""
	})
	if now, _ := h.remoteCopy(a, "web"); now.UID != first.UID {
		t.Fatalf("the copy in cluster a was made again (uid %s, was %s): it was deleted while a did not answer", now.UID, first.UID)
	}
	for _, name := range []string{"m1", "m2"} {
		if h.moved(a, name) != uids["a/"+name] {
			t.Fatalf("%s's copy in cluster a was deleted or made again across the outage", name)
		}
	}
	h.eventually("m1 to be Ready again", func() bool {
		c := readyCondition(h.widget("m1"))
		return c != nil && c["status"] == "True"
	})

	// b leaves the selection: spread's copy stays as it was (orphaned), a's
	// follows on. m0 moves into b; m1 and m2 leave it — 2 of its 3 moved
	// children, more than 10%: held until maxPrunes is raised.
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
	h.eventually("m0's copy to move into b", func() bool { return h.moved(b, "m0") != "" })
	h.waitForEventWithin(30*time.Second, ReasonLeaveHeld, "m1", `children leaving cluster "b" are held there`)
	for _, name := range []string{"m1", "m2"} {
		if h.moved(b, name) != uids["b/"+name] {
			t.Fatalf("%s's copy in cluster b went, though more than maxPrunes of b's children leave it", name)
		}
	}
	h.updates <- h.fleetRules("100%")
	h.eventually("m1's and m2's copies to leave b once maxPrunes allows", func() bool { return h.moved(b, "m1") == "" && h.moved(b, "m2") == "" })
	if h.moved(b, "m0") == "" || h.moved(a, "m1") != uids["a/m1"] {
		t.Fatal("a copy still selected went with those that left")
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
	if !h.within(60*time.Second, func() bool {
		_, ok := h.remoteCopy(a, "web")
		_, err := a.cs.CoreV1().ConfigMaps("default").List(t.Context(), metav1.ListOptions{Limit: 1})
		return !ok && err == nil
	}) {
		cm, _ := h.remoteCopy(a, "web")
		t.Fatalf("the copy in cluster a did not go with its trigger: %+v", cm.ObjectMeta)
	}
	if !h.within(30*time.Second, func() bool { _, ok := h.configMap(h.ns, "web"); return !ok }) {
		web, _ := h.configMap(h.ns, "web")
		p, why := h.loop("spread").fleet.placeOf("a")
		var cached []string
		if p != nil {
			for _, c := range p.rc.childrenOf(rules.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Namespace: h.ns, Name: "web"}.Owner()) {
				cached = append(cached, fmt.Sprintf("%s deleting=%v", c.GetName(), c.GetDeletionTimestamp() != nil))
			}
		}
		t.Fatalf("the trigger was not let go: finalizers %v; cluster a's place: %v (unreachable: %v), its cache of the trigger's children: %v", web.Finalizers, p != nil, why, cached)
	}
	if !h.copyHas(b, "web", "v2") || h.moved(b, "m0") == "" {
		t.Fatal("a copy in cluster b, no longer in the inventory, was deleted")
	}
}

// patchSecret merge-patches the Secret name in h's namespace.
func (h *harness) patchSecret(name, patch string) {
	h.t.Helper()
	if _, err := h.cs.CoreV1().Secrets(h.ns).Patch(h.t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestFleetSelf: syncloop's own cluster in the inventory (as fleets list
// their management cluster) gets the children of the resources that
// target it, beside those of a resource that does not: neither place takes
// the other's children for its own to prune, though both see them. The
// trigger deleted, its children there go dependents first.
//
// API server: one control plane, in the inventory as cluster self; the
// requests of syncloop's clients to it, home and remote.
func TestFleetSelf(t *testing.T) {
	h := newHarness(t)
	h.runInventory(true)
	h.putCluster(&workload{name: "self", env: h.env, cs: h.cs}, nil)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: self}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "self=yes"}
  resources:
    - id: home
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-home"}
    - id: away
      clusters: {names: [self]}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-away", namespace: NS}
    - id: after
      clusters: {names: [self]}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-after", namespace: NS}
        data: {reads: "${string(size(children.away))}"}
`))
	h.createCM("web", map[string]string{"self": "yes"}, nil)
	h.eventually("the three children, and the rule idle", func() bool {
		_, home := h.configMap(h.ns, "web-home")
		_, away := h.configMap(h.ns, "web-away")
		_, after := h.configMap(h.ns, "web-after")
		return home && away && after && h.loop("self").idle()
	})
	deletes := func() []testenv.Request {
		return h.counter.Requests(func(r testenv.Request) bool { return r.Method == "DELETE" && r.Status < 300 })
	}
	if d := deletes(); len(d) > 0 {
		t.Fatalf("syncloop deleted %s: a place pruned the other's child", d[0].Path)
	}

	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the trigger let go, its children gone", func() bool {
		_, trigger := h.configMap(h.ns, "web")
		_, away := h.configMap(h.ns, "web-away")
		_, after := h.configMap(h.ns, "web-after")
		return !trigger && !away && !after
	})
	var order []string
	for _, r := range deletes() {
		order = append(order, r.Path[strings.LastIndex(r.Path, "/")+1:])
	}
	t.Logf("deletes, in order: %v", order)
	if i, j := slices.Index(order, "web-after"), slices.Index(order, "web-away"); i < 0 || j < 0 || i > j {
		t.Errorf("deletes %v: want web-after, which reads web-away, deleted first", order)
	}
}

// TestFleetRemoteKind: a resource may put in the clusters of a fleet a
// kind that only they serve (a CRD installed there, not in syncloop's own
// cluster): the rule runs, and the children are made there.
//
// API server: two control planes, the CRD installed in the workload one.
func TestFleetRemoteKind(t *testing.T) {
	h := newHarness(t)
	w := startWorkloads(t, "edge")[0]
	if _, err := w.env.InstallCRDs(t.Context(), filepath.Join("testdata", "probes-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	h.runInventory(false)
	h.putCluster(w, nil)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: probes}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "probe=yes"}
  resources:
    - id: probe
      clusters: {names: [edge]}
      template:
        apiVersion: fleet.syncloop.dev/v1
        kind: Probe
        metadata: {name: "${object.metadata.name}", namespace: default}
        spec: {target: "${object.data.target}"}
`))
	h.createCM("web", map[string]string{"probe": "yes"}, map[string]string{"target": "https://example.com"})
	probes := schema.GroupVersionResource{Group: "fleet.syncloop.dev", Version: "v1", Resource: "probes"}
	dc, err := k8sdynamic.NewForConfig(w.env.Config())
	if err != nil {
		t.Fatal(err)
	}
	h.eventually("the Probe in cluster edge", func() bool {
		p, err := dc.Resource(probes).Namespace("default").Get(t.Context(), "web", metav1.GetOptions{})
		return err == nil && p.Object["spec"].(map[string]any)["target"] == "https://example.com"
	})
}

// TestFleetDryRun: a dry run over a fleet plans each write in its cluster
// and sends none for real there either; children leaving a cluster beyond
// the prune budget are planned as held, not deleted; one trigger that
// leaves within the budget is planned as a delete there.
//
// API server: one control plane, in the inventory as cluster self;
// server-side dry runs through the remote client.
func TestFleetDryRun(t *testing.T) {
	h := newHarness(t)
	inv := h.runInventory(true)
	h.putCluster(&workload{name: "self", env: h.env, cs: h.cs}, map[string]string{"env": "prod"})
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: leave}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "leave"}
  resources:
    - id: copy
      clusters: {selector: "cluster.labels.?env.orValue('') == object.metadata.labels.leave", onLeave: Delete}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy", namespace: NS}
`
	for _, name := range []string{"t0", "t1", "t2"} {
		h.createCM(name, map[string]string{"leave": "prod"}, nil)
	}
	h.start(h.loadRules(rule))
	h.eventually("three copies in cluster self", func() bool {
		for _, name := range []string{"t0", "t1", "t2"} {
			if _, ok := h.configMap(h.ns, name+"-copy"); !ok {
				return false
			}
		}
		return true
	})
	h.stop()

	// Every trigger leaves self (relabelled): held. t3 is new: planned.
	h.patchSecret("self-kubeconfig", `{"metadata":{"labels":{"env":"dev"}}}`)
	h.eventually("the inventory to see self relabelled", func() bool { return inv.Clusters()[0].Labels["env"] == "dev" })
	h.createCM("t3", map[string]string{"leave": "dev"}, nil)
	planner := &recordingPlanner{}
	h.plan = planner
	h.counter.Reset()
	h.start(h.loadRules(rule))
	// What is planned for which object in self (a sweep or a reconcile
	// may plan it more than once).
	planned := func(action string, match func(Action) bool) []string {
		planner.mu.Lock()
		defer planner.mu.Unlock()
		var names []string
		for _, a := range planner.actions {
			if a.Action == action && a.Cluster == "self" && (match == nil || match(a)) && !slices.Contains(names, a.Object.Name) {
				names = append(names, a.Object.Name)
			}
		}
		slices.Sort(names)
		return names
	}
	isHeld := func(a Action) bool { return strings.Contains(a.Reason, "leaving the cluster, held") }
	h.eventually("three copies planned as held in self, t3's copy planned there", func() bool {
		return slices.Equal(planned(ActionWait, isHeld), []string{"t0-copy", "t1-copy", "t2-copy"}) &&
			slices.Equal(planned(ActionCreate, nil), []string{"t3-copy"})
	})
	if n := planner.count(ActionDelete); n != 0 {
		t.Errorf("a dry run planned %d deletes of children held by the prune budget", n)
	}
	for _, r := range h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() }) {
		if !r.DryRun() {
			t.Errorf("a dry run sent a real write: %s %s", r.Method, r.Path)
		}
	}
	if _, ok := h.configMap(h.ns, "t3-copy"); ok {
		t.Error("a dry run made a child in cluster self")
	}
	h.stop()

	// Back to prod, and only t0 leaves: within the budget, a delete.
	h.patchSecret("self-kubeconfig", `{"metadata":{"labels":{"env":"prod"}}}`)
	h.eventually("the inventory to see self relabelled back", func() bool { return inv.Clusters()[0].Labels["env"] == "prod" })
	h.updateCM("t0", func(cm *corev1.ConfigMap) { cm.Labels["leave"] = "dev" })
	planner = &recordingPlanner{}
	h.plan = planner
	h.start(h.loadRules(rule))
	h.eventually("t0's copy planned as deleted in self", func() bool {
		planner.mu.Lock()
		defer planner.mu.Unlock()
		for _, a := range planner.actions {
			if a.Action == ActionDelete && a.Cluster == "self" && a.Object.Name == "t0-copy" {
				return true
			}
		}
		return false
	})
	if _, ok := h.configMap(h.ns, "t0-copy"); !ok {
		t.Error("a dry run deleted a child")
	}
}
