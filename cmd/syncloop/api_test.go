package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// widgetRule defines the Widget kind (spec.api) and turns each Widget into
// a ConfigMap; {{FIELDS}} are more fields of its spec.
const widgetRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata:
  name: widget
spec:
  api:
    apiVersion: apimode.syncloop.dev/v1
    kind: Widget
    spec:
      size: integer | default=1 minimum=0 maximum=100
      tier: string | enum=gold,silver,bronze default=bronze
{{FIELDS}}
    validations:
      - rule: "self.size <= 10 || self.tier == 'gold'"
        message: only gold widgets are bigger than 10
  resources:
    - id: config
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}"}
        data: {size: "${string(object.spec.size)}", tier: "${object.spec.tier}"}
  status:
    size: ${object.spec.size}
    configName: ${children.config.metadata.name}
`

var (
	crdGVR    = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	widgetGVR = schema.GroupVersionResource{Group: "apimode.syncloop.dev", Version: "v1", Resource: "widgets"}
)

// clients are the control plane and its admin clients.
func clients(t *testing.T) (*testenv.Env, kubernetes.Interface, k8sdynamic.Interface) {
	t.Helper()
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	return env, cs, dc
}

// TestAPIMode: a rule with spec.api makes syncloop keep its CRD: created
// at start (syncloop's labels), instances served with their defaults and
// validations, reconciled, their status typed and Ready; a compatible
// change updates the CRD while it runs; a breaking change is refused with
// its file:line:col and the last good version keeps running; removing the
// rule leaves the CRD and its objects.
func TestAPIMode(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "apimode")
	dir := filepath.Join(t.TempDir(), "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "widget.yaml")
	write := func(fields string) {
		t.Helper()
		tmp := file + ".tmp" // renamed into place, as editors do
		if err := os.WriteFile(tmp, []byte(strings.Replace(widgetRule, "{{FIELDS}}\n", fields, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	// A bystander rule, which a change to the widget rule must not restart.
	writeFile(t, dir, "bystander.yaml", namespaceRule("bystander", ns))
	metricsAddr, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig())
	metric := func(series string) string {
		for _, l := range strings.Split(httpGet("http://"+metricsAddr+"/metrics"), "\n") {
			if strings.HasPrefix(l, series+" ") {
				return strings.TrimPrefix(l, series+" ")
			}
		}
		return ""
	}
	readyz, poll := probing(t, probes, 60*time.Second)
	crds := dc.Resource(crdGVR)
	crd := func() *unstructured.Unstructured {
		got, err := crds.Get(ctx, "widgets.apimode.syncloop.dev", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return got
	}
	poll("the CRD created and the rule running", func() bool {
		return crd() != nil && strings.Contains(readyz(), "rule widget: running")
	})
	if l := crd().GetLabels(); l["app.kubernetes.io/managed-by"] != "syncloop" || l["syncloop.dev/rule"] != "widget" {
		t.Errorf("CRD labels %v", l)
	}

	widgets := dc.Resource(widgetGVR).Namespace(ns)
	widget := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apimode.syncloop.dev/v1", "kind": "Widget",
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	if _, err := widgets.Create(ctx, widget("w", map[string]any{}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := widgets.Create(ctx, widget("big", map[string]any{"size": int64(20)}), metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "only gold widgets are bigger than 10") {
		t.Errorf("a bronze widget of 20: %v, want refused by the validation", err)
	}
	configData := func(name string) map[string]string {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		return cm.Data
	}
	poll("the defaulted widget's ConfigMap", func() bool {
		d := configData("w")
		return d["size"] == "1" && d["tier"] == "bronze"
	})
	poll("the widget's status, typed, and Ready", func() bool {
		w, err := widgets.Get(ctx, "w", metav1.GetOptions{})
		if err != nil {
			return false
		}
		size, _, _ := unstructured.NestedInt64(w.Object, "status", "size")
		name, _, _ := unstructured.NestedString(w.Object, "status", "configName")
		conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
		ready := false
		for _, c := range conds {
			m := c.(map[string]any)
			ready = ready || (m["type"] == "Ready" && m["status"] == "True")
		}
		return size == 1 && name == "w" && ready
	})

	bystander := `syncloop_reconcile_total{result="success",rule="bystander"}`
	// Its reconciles: the trigger's, then its child's event's, then none.
	var reconciled string
	poll("the bystander reconciled, and then idle", func() bool {
		prev := reconciled
		reconciled = metric(bystander)
		time.Sleep(300 * time.Millisecond)
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "bystander", metav1.GetOptions{})
		return err == nil && reconciled != "" && reconciled == prev
	})
	if got := metric(`syncloop_crd_apply_total{result="created",rule="widget"}`); got != "1" {
		t.Errorf("CRD creates counted: %q", got)
	}

	// A new optional field: the CRD is updated while syncloop runs.
	widgetReconciles := metric(`syncloop_reconcile_total{result="success",rule="widget"}`)
	write("      color: string | default=blue\n")
	poll("the CRD with the new field", func() bool {
		c := crd()
		_, found, _ := unstructured.NestedMap(c.Object, "spec", "versions")
		versions, _, _ := unstructured.NestedSlice(c.Object, "spec", "versions")
		if !found && len(versions) == 0 {
			return false
		}
		_, ok, _ := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "color")
		return ok
	})
	poll("the new field served with its default", func() bool {
		w, err := widgets.Get(ctx, "w", metav1.GetOptions{})
		color, _, _ := unstructured.NestedString(w.Object, "spec", "color")
		return err == nil && color == "blue"
	})
	poll("the CRD update counted", func() bool { return metric(`syncloop_crd_apply_total{result="updated",rule="widget"}`) == "1" })
	// The changed rule restarts — it reconciles its widgets again — and
	// only it: a restarted rule would list and reconcile its trigger again.
	poll("the changed rule running again", func() bool {
		return metric(`syncloop_reconcile_total{result="success",rule="widget"}`) != widgetReconciles
	})
	if got := metric(bystander); got != reconciled {
		t.Errorf("the bystander rule reconciled %s times, %s before: restarted by another rule's change", got, reconciled)
	}

	// A breaking change — size retyped — is refused; the last good
	// version keeps running and the CRD stays as it was.
	before := crd().GetGeneration() // the spec's; the API server writes the status
	breaking := strings.Replace(widgetRule, "size: integer | default=1 minimum=0 maximum=100", "size: string", 1)
	breaking = strings.Replace(breaking, "{{FIELDS}}\n", "      color: string | default=blue\n", 1)
	breaking = strings.NewReplacer("self.size <= 10", "int(self.size) <= 10", "string(object.spec.size)", "object.spec.size").Replace(breaking)
	if err := os.WriteFile(file, []byte(breaking), 0o644); err != nil {
		t.Fatal(err)
	}
	poll("the breaking change reported at its line", func() bool {
		b := readyz()
		return strings.Contains(b, `widget.yaml:10:7: rule "widget": spec.api.spec.size: breaking change to the served CustomResourceDefinition widgets.apimode.syncloop.dev: spec.size is retyped from integer to string`) &&
			strings.Contains(b, "its last good version stays in force") && strings.Contains(b, "rule widget: running")
	})
	if got := crd().GetGeneration(); got != before {
		t.Errorf("the CRD changed (generation %d → %d) on a breaking change", before, got)
	}
	if _, err := widgets.Create(ctx, widget("w2", map[string]any{"size": int64(2)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the last good version reconciling a new widget", func() bool { return configData("w2")["size"] == "2" })

	// The rule removed: its CRD and objects stay.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	poll("the rule gone", func() bool { return !strings.Contains(readyz(), "widget") })
	if crd() == nil {
		t.Fatal("the CRD was deleted with its rule")
	}
	if list, err := widgets.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 2 {
		t.Errorf("widgets after the rule's removal: %v, %v", len(list.Items), err)
	}
	t.Cleanup(func() { _ = crds.Delete(context.Background(), "widgets.apimode.syncloop.dev", metav1.DeleteOptions{}) })
}

// TestAPIModeCRDsFromElsewhere: a CRD syncloop did not create is never
// taken over (plan and run say so); with --manage-crds=false syncloop only
// checks the served CRD, reports how it differs from the rule's, and runs
// the rule once it matches — the CRD `syncloop crds` prints. plan shows
// the CRD it would create, and an update with its diff.
func TestAPIModeCRDsFromElsewhere(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	dir := t.TempDir()
	rule := strings.NewReplacer("apimode.syncloop.dev", "gitops.syncloop.dev", "name: widget", "name: gadget", "{{FIELDS}}\n", "").Replace(widgetRule)
	file := writeFile(t, dir, "gadget.yaml", rule)
	kube := []string{"--kubeconfig", env.Kubeconfig()}

	// No CRD yet: plan would create it.
	code, out, errOut := syncloop(t, append([]string{"plan", "-f", file}, kube...)...)
	if code != 2 || !strings.Contains(out, "+ create  apiextensions.k8s.io/v1 CustomResourceDefinition widgets.gitops.syncloop.dev  (rule gadget)") {
		t.Errorf("plan with no CRD: exit %d\n%s%s", code, out, errOut)
	}

	// run --dry-run says it would create it, and does not.
	dryCtx, cancel := context.WithCancel(ctx)
	var dryOut syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(dryCtx, append([]string{"run", "--dry-run", "-f", file, "--metrics-bind-address", "0", "--health-probe-bind-address", "0"}, kube...), &dryOut, io.Discard)
	}()
	pollUntil(t, 30*time.Second, "run --dry-run's planned CRD", func() bool {
		return strings.Contains(dryOut.String(), "+ create  apiextensions.k8s.io/v1 CustomResourceDefinition widgets.gitops.syncloop.dev  (rule gadget)")
	})
	cancel()
	if code := <-exited; code != 0 {
		t.Errorf("run --dry-run exited %d", code)
	}
	if _, err := dc.Resource(crdGVR).Get(ctx, "widgets.gitops.syncloop.dev", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("run --dry-run created the CRD: %v", err)
	}

	// The CRD as GitOps would install it, from syncloop crds, without its
	// labels and with one field less.
	code, generated, errOut := syncloop(t, "crds", "-f", file)
	if code != 0 {
		t.Fatalf("crds: exit %d: %s", code, errOut)
	}
	foreign := strings.NewReplacer("    app.kubernetes.io/managed-by: syncloop\n", "", "    syncloop.dev/rule: gadget\n", "").Replace(generated)
	foreign = strings.Replace(foreign, "  labels:\n", "  labels: {}\n", 1)
	foreign = strings.Replace(foreign, `              tier:
                default: bronze
                enum:
                - gold
                - silver
                - bronze
                type: string
`, "", 1)
	foreign = strings.Replace(foreign, "              tier: bronze\n", "", 1)
	foreign = strings.Replace(foreign, "            x-kubernetes-validations:\n            - message: only gold widgets are bigger than 10\n              rule: self.size <= 10 || self.tier == 'gold'\n", "", 1)
	if foreign == generated {
		t.Fatal("the CRD was not changed")
	}
	if _, err := env.InstallCRDs(ctx, writeFile(t, dir, "crd.yaml.txt", foreign)); err != nil {
		t.Fatal(err)
	}
	crds := dc.Resource(crdGVR)
	t.Cleanup(func() { _ = crds.Delete(context.Background(), "widgets.gitops.syncloop.dev", metav1.DeleteOptions{}) })

	code, _, errOut = syncloop(t, append([]string{"plan", "-f", file}, kube...)...)
	if code != 1 || !strings.Contains(errOut, `gadget.yaml:7:5: rule "gadget": spec.api: CustomResourceDefinition widgets.gitops.syncloop.dev exists and is not this installation's of syncloop: syncloop never takes over a CRD it did not create`) {
		t.Errorf("plan over a foreign CRD: exit %d, stderr %s", code, errOut)
	}
	code, _, errOut = syncloop(t, append([]string{"plan", "--manage-crds=false", "-f", file}, kube...)...)
	if code != 1 || !strings.Contains(errOut, "differs from the one the rule defines") || !strings.Contains(errOut, "spec.properties.tier is not served") {
		t.Errorf("plan --manage-crds=false over a different CRD: exit %d, stderr %s", code, errOut)
	}

	ns := newNamespace(t, cs, "gitops")
	_, probes := runInProcess(t, append([]string{"-f", dir, "--manage-crds=false"}, kube...)...)
	readyz, poll := probing(t, probes, 60*time.Second)
	poll("the difference reported", func() bool {
		return strings.Contains(readyz(), "spec.properties.tier is not served")
	})
	served, err := crds.Get(ctx, "widgets.gitops.syncloop.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(served.GetLabels()) != 0 {
		t.Errorf("syncloop changed the CRD it does not manage: labels %v", served.GetLabels())
	}

	// GitOps catches up: the CRD syncloop crds printed.
	if _, err := env.InstallCRDs(ctx, writeFile(t, dir, "crd2.yaml.txt", generated)); err != nil {
		t.Fatal(err)
	}
	poll("the rule running", func() bool {
		return strings.Contains(readyz(), "rule gadget: running") && !strings.Contains(readyz(), "file ")
	})
	widgets := dc.Resource(schema.GroupVersionResource{Group: "gitops.syncloop.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	if _, err := widgets.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gitops.syncloop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "g"}, "spec": map[string]any{"size": int64(3)}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the widget reconciled", func() bool {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "g", metav1.GetOptions{})
		return err == nil && cm.Data["size"] == "3"
	})

	// The CRD is now syncloop's: a new field is an update, with its diff.
	writeFile(t, dir, "gadget.yaml", strings.Replace(rule, "      tier:", "      color: string\n      tier:", 1))
	code, out, errOut = syncloop(t, append([]string{"plan", "-f", file}, kube...)...)
	if code != 2 || !strings.Contains(out, "~ update  apiextensions.k8s.io/v1 CustomResourceDefinition widgets.gitops.syncloop.dev  (rule gadget)") || !strings.Contains(out, "+              color:") {
		t.Errorf("plan of a new field: exit %d\n%s%s", code, out, errOut)
	}
}

// TestAPIModeNamesRefused: a kind whose names another CRD holds is
// refused by the API server (NamesAccepted False): syncloop says why in
// /readyz at once rather than waiting; the rule never runs against the
// other CRD's resource that serves its kind, and the other rules run.
func TestAPIModeNamesRefused(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	dir := t.TempDir()
	// Another CRD of the group already serves kind Widget, as "things".
	foreign := `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.taken.syncloop.dev}
spec:
  group: taken.syncloop.dev
  scope: Namespaced
  names: {kind: Widget, plural: things, singular: thing, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`
	if _, err := env.InstallCRDs(ctx, writeFile(t, dir, "foreign.yaml.txt", foreign)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{"things.taken.syncloop.dev", "widgets.taken.syncloop.dev"} {
			_ = dc.Resource(crdGVR).Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	})
	rules := filepath.Join(dir, "rules")
	if err := os.Mkdir(rules, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, rules, "widget.yaml", strings.NewReplacer("apimode.syncloop.dev", "taken.syncloop.dev", "{{FIELDS}}\n", "").Replace(widgetRule))
	ns := newNamespace(t, cs, "taken")
	writeFile(t, rules, "other.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: other}
spec:
  watch: {apiVersion: v1, kind: Namespace, fieldSelector: metadata.name=`+ns+`}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: other, namespace: "${object.metadata.name}"}}
`)
	_, probes := runInProcess(t, "-f", rules, "--kubeconfig", env.Kubeconfig())
	_, poll := probing(t, probes, 60*time.Second)
	poll("the refused names in /readyz, the other rule running", func() bool {
		b := httpGet("http://" + probes + "/readyz")
		return strings.Contains(b, `crd widgets.taken.syncloop.dev (rule widget): waiting for the CustomResourceDefinition to be established: its names are not accepted: "WidgetList" is already in use`) &&
			strings.Contains(b, "rule widget: waiting: kind taken.syncloop.dev/v1, Kind=Widget is served as things.taken.syncloop.dev, not by the rule's CustomResourceDefinition widgets.taken.syncloop.dev") &&
			strings.Contains(b, "rule other: running")
	})
	poll("the other rule's child", func() bool {
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "other", metav1.GetOptions{})
		return err == nil
	})
}
