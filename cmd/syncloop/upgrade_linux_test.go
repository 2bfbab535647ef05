package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// previousRelease is the syncloop an upgrade starts from: main before
// issue #48's changes. Move it forward when a release is cut.
const previousRelease = "b277e140cbf713dee91a7ba36411023a651ecf04"

// upgradeExamples are the examples the upgrade runs: between them every
// kind of work — children, forEach, lookups by name and by list, a graph
// with readyWhen, a status with its Ready condition, a kind defined by a
// rule (its CRD), a patch of objects syncloop does not own, a chain
// through a token controller — and the rules' revisions.
var upgradeExamples = []string{"tenant-defaults", "replicate", "app", "namespace-metadata", "pull-secret", "team-network-policy", "namespace-label", "ci-robot"}

// TestUpgradeWithoutChurn: the previous release, installed by its chart
// and run as the chart's ServiceAccount, converges the examples; the
// chart is upgraded to this one and this syncloop runs in its place. It
// writes nothing: no child, patched object, trigger status or CRD
// changes (their resourceVersions are as the previous one left them), no
// revision is added or renumbered, and it counts no create, update, adopt,
// delete or status write. The writes it makes are the rule file each
// rule's newest revision came from, marked on it once (what a start with
// that file broken recovers from), and the teardown finalizer on each App
// (its rule defines the kind, so orders its teardown: new in this
// version), nothing else of them changed.
func TestUpgradeWithoutChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the previous release and starts a control plane of its own")
	}
	t.Parallel() // a control plane of its own: nothing shared with the other tests
	ctx := t.Context()
	prev, err := testenv.BuildRevision(ctx, previousRelease)
	if err != nil {
		t.Fatal(err)
	}
	// A control plane of its own: the examples' namespaces are fixed.
	env, err := testenv.Start(ctx, testenv.Options{ControllerManager: true, Controllers: []string{"serviceaccount-token"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	const ns = "syncloop-system"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	examples := filepath.Join(prev.Source, "examples") // the rules stay; syncloop and its chart change
	helm := func(verb, chart string) {
		t.Helper()
		args := []string{verb, "syncloop", chart, "-n", ns, "--kubeconfig", env.Kubeconfig()}
		for _, ex := range upgradeExamples {
			args = append(args, "--set-file", "rules."+ex+"\\.yaml="+filepath.Join(examples, ex, "rules.yaml"))
		}
		if out, err := helmCmd(t, args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	helm("install", filepath.Join(prev.Source, "charts", "syncloop"))

	previous := runChartRelease(t, env, ns, prev.Binary)
	poll := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 2*time.Minute, what, cond) }
	poll("the App CRD", func() bool {
		_, err := cs.Discovery().ServerResourcesForGroupVersion("example.syncloop.dev/v1")
		return err == nil
	})
	var samples []string
	for _, ex := range upgradeExamples {
		path := filepath.Join(examples, ex, "objects.yaml")
		if err := applySamples(ctx, env, path); err != nil {
			t.Fatal(err)
		}
		samples = append(samples, path)
	}
	snap := newSnapshotter(t, env, samples)
	var before map[string]string
	poll("the previous release to converge (nothing changing for 3 s)", func() bool {
		s := snap.take()
		if !sameSnapshot(s, before) || len(s) == 0 {
			before = s
			snap.stableSince = time.Now()
			return false
		}
		return time.Since(snap.stableSince) > 3*time.Second && snap.children(s) > 20
	})
	previous.stop()
	t.Logf("the previous release left %d objects (%d of them syncloop's)", len(before), snap.children(before))

	helm("upgrade", chartDir)
	current := runChartRelease(t, env, ns, "")
	// Every child looked at (written or not), and nothing queued or under
	// way.
	poll("this syncloop to look at every child, and be idle", func() bool {
		page := httpGet("http://" + current.metrics + "/metrics")
		looked := 0.0
		for _, action := range []string{"unchanged", "create", "update", "adopt"} {
			looked += sumSeries(page, `syncloop_apply_total{action="`+action+`"`)
		}
		return looked >= float64(snap.children(before)) &&
			sumSeries(page, "workqueue_depth{") == 0 && sumSeries(page, "workqueue_unfinished_work_seconds{") == 0
	})
	after := snap.take()
	page := httpGet("http://" + current.metrics + "/metrics")
	current.stop()
	for _, action := range []string{"create", "update", "adopt", "delete", "status"} {
		if n := sumSeries(page, `syncloop_apply_total{action="`+action+`"`); n > 0 {
			t.Errorf("this syncloop counted %v %s writes, want none", n, action)
		}
	}
	for _, d := range diffSnapshots(before, after) {
		t.Errorf("changed by the upgrade: %s", d)
	}
	revs, err := cs.AppsV1().ControllerRevisions(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newest := map[string]appsv1.ControllerRevision{}
	for _, cr := range revs.Items {
		if n, ok := newest[cr.Labels[rules.LabelRule]]; !ok || cr.Revision > n.Revision {
			newest[cr.Labels[rules.LabelRule]] = cr
		}
	}
	for _, cr := range newest {
		if !strings.HasSuffix(cr.Annotations[rules.AnnotationSourceFile], ".yaml") {
			t.Errorf("revision %s names no rule file (%q): a restart with its file broken could not recover it", cr.Name, cr.Annotations[rules.AnnotationSourceFile])
		}
	}
}

// chartRelease is a syncloop running as the chart's release would.
type chartRelease struct {
	metrics string
	stop    func()
}

// runChartRelease runs bin ("": this syncloop) as the chart's
// ServiceAccount, with the rules of the chart's ConfigMap and leader
// election, as the chart's Deployment runs it.
func runChartRelease(t *testing.T, env *testenv.Env, ns, bin string) *chartRelease {
	t.Helper()
	ctx := t.Context()
	sa, err := env.ServiceAccountConfig(ctx, ns, "syncloop")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, sa, "syncloop"); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "syncloop-rules", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, text := range cm.Data {
		writeFile(t, dir, name, text)
	}
	r := &chartRelease{metrics: freeAddr(t)}
	args := []string{"run", "-f", dir, "--kubeconfig", kubeconfig, "--leader-elect", "--leader-elect-namespace", ns,
		"--leader-elect-id", "syncloop", "--rules-configmap", ns + "/syncloop-rules",
		"--metrics-bind-address", r.metrics, "--health-probe-bind-address", "0"}
	var cmd *exec.Cmd
	if bin == "" {
		cmd = syncloopProcess(t, "current", args...)
	} else {
		log, err := os.Create(filepath.Join(t.TempDir(), "previous.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := os.ReadFile(log.Name())
				t.Logf("previous output:\n%s", tail(string(out), 40))
			}
		})
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(40 * time.Second):
			t.Errorf("syncloop did not stop on SIGTERM")
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	return r
}

// snapshotter reads the resourceVersion of everything syncloop wrote or
// may write: every object labelled as syncloop's (children, revisions,
// the CRD of the kind a rule defines) and every sample object (triggers,
// their statuses, objects patched).
type snapshotter struct {
	t           *testing.T
	dc          k8sdynamic.Interface
	resources   []schema.GroupVersionResource
	samples     []*objectRef
	stableSince time.Time
}

type objectRef struct {
	gvr       schema.GroupVersionResource
	namespace string
	name      string
}

func newSnapshotter(t *testing.T, env *testenv.Env, samplePaths []string) *snapshotter {
	t.Helper()
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	lists, err := disco.ServerPreferredResources()
	if err != nil {
		t.Fatal(err)
	}
	s := &snapshotter{t: t, dc: dc}
	kinds := map[schema.GroupVersionKind]schema.GroupVersionResource{}
	for _, l := range lists {
		gv, _ := schema.ParseGroupVersion(l.GroupVersion)
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			kinds[gv.WithKind(r.Kind)] = gvr
			if gvr.Group != "coordination.k8s.io" && gvr.Resource != "events" {
				s.resources = append(s.resources, gvr)
			}
		}
	}
	for _, p := range samplePaths {
		objs, err := rules.ReadObjects(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if gvr, ok := kinds[o.GroupVersionKind()]; ok {
				s.samples = append(s.samples, &objectRef{gvr: gvr, namespace: o.GetNamespace(), name: o.GetName()})
			}
		}
	}
	return s
}

// take maps "<resource> <namespace>/<name>" to resourceVersion.
func (s *snapshotter) take() map[string]string {
	ctx := s.t.Context()
	out := map[string]string{}
	for _, gvr := range s.resources {
		list, err := s.dc.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelManagedBy + "=" + rules.ManagedByValue})
		if err != nil {
			continue
		}
		for _, o := range list.Items {
			out[fmt.Sprintf("%s %s/%s", gvr.GroupResource(), o.GetNamespace(), o.GetName())] = snapshotOf(o)
		}
	}
	for _, r := range s.samples {
		o, err := s.dc.Resource(r.gvr).Namespace(r.namespace).Get(ctx, r.name, metav1.GetOptions{})
		if err == nil {
			out[fmt.Sprintf("%s %s/%s", r.gvr.GroupResource(), r.namespace, r.name)] = sampleSnapshot(o)
		}
	}
	return out
}

// children counts syncloop's objects in a snapshot: all but the samples
// and its revisions.
func (s *snapshotter) children(snap map[string]string) int {
	samples := map[string]bool{}
	for _, r := range s.samples {
		samples[fmt.Sprintf("%s %s/%s", r.gvr.GroupResource(), r.namespace, r.name)] = true
	}
	n := 0
	for k := range snap {
		if !samples[k] && !strings.HasPrefix(k, "controllerrevisions.apps ") && !strings.HasPrefix(k, "customresourcedefinitions.") {
			n++
		}
	}
	return n
}

// snapshotOf is what a snapshot holds of o: its resourceVersion, but for a
// revision the content that makes it the revision it is — its number, its
// source, its labels and its annotations but for the source file it came
// from, which revisions recorded before the mark existed gain once
// (marked checks that they do).
func snapshotOf(o unstructured.Unstructured) string {
	if o.GetKind() != "ControllerRevision" {
		return o.GetResourceVersion()
	}
	annotations := o.GetAnnotations()
	delete(annotations, rules.AnnotationSourceFile)
	return fmt.Sprint(o.Object["revision"], o.Object["data"], o.GetLabels(), annotations)
}

// sampleSnapshot is a sample object as the upgrade may not change it:
// all of it but its resourceVersion, managedFields and syncloop's
// teardown finalizer, which this version puts once on each trigger of a
// rule that orders its teardown (the App of a rule with spec.api): the
// one write to the samples an upgrade makes.
func sampleSnapshot(o *unstructured.Unstructured) string {
	o = o.DeepCopy()
	o.SetResourceVersion("")
	o.SetManagedFields(nil)
	if f := slices.DeleteFunc(o.GetFinalizers(), func(f string) bool { return rules.IsTeardownFinalizer(f, "") }); len(f) > 0 {
		o.SetFinalizers(f)
	} else {
		unstructured.RemoveNestedField(o.Object, "metadata", "finalizers")
	}
	b, _ := json.Marshal(o.Object)
	return string(b)
}

func sameSnapshot(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// diffSnapshots lists what was added, removed or changed, sorted.
func diffSnapshots(before, after map[string]string) []string {
	var out []string
	for k, v := range before {
		switch w, ok := after[k]; {
		case !ok:
			out = append(out, k+": removed")
		case w != v:
			out = append(out, fmt.Sprintf("%s: resourceVersion %s → %s", k, v, w))
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			out = append(out, k+": added")
		}
	}
	sort.Strings(out)
	return out
}

// sumSeries sums the series of a /metrics page whose text starts with
// prefix (a metric and the first of its labels).
func sumSeries(page, prefix string) float64 {
	sum := 0.0
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, prefix) {
			if m := seriesValue.FindStringSubmatch(l); m != nil {
				var v float64
				fmt.Sscan(m[1], &v)
				sum += v
			}
		}
	}
	return sum
}

var seriesValue = regexp.MustCompile(`} (\S+)$`)
