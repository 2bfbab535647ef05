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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// gadgetCRD defines recheck.syncloop.dev/v1 Gadget with the given spec
// fields, each an integer.
func gadgetCRD(fields ...string) string {
	props := ""
	for _, f := range fields {
		props += "                " + f + ": {type: integer}\n"
	}
	return `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.recheck.syncloop.dev}
spec:
  group: recheck.syncloop.dev
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
` + props
}

const gadgetRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: gadget}
spec:
  watch: {apiVersion: recheck.syncloop.dev/v1, kind: Gadget}
  when: object.spec.size > 1
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}", namespace: "${object.metadata.namespace}"}
        data: {size: "${string(object.spec.size)}", age: "${string(object.metadata.creationTimestamp.getFullYear() > 2000)}"}
`

// TestRunTypesFromTheCluster: run types rules by the CRDs installed in the
// cluster (no CRD among the rule files), and checks them again when a CRD
// changes: a rule that no longer type-checks is reported like a broken
// file and keeps its last good version; fixed, it loads again.
func TestRunTypesFromTheCluster(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	crdFile := filepath.Join(t.TempDir(), "crd.yaml")
	install := func(fields ...string) {
		t.Helper()
		if err := os.WriteFile(crdFile, []byte(gadgetCRD(fields...)), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := env.InstallCRDs(ctx, crdFile); err != nil {
			t.Fatal(err)
		}
	}
	install("size")
	ns := newNamespace(t, cs, "types")
	dir := filepath.Join(t.TempDir(), "rules")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"gadget.yaml": gadgetRule,
		"typo.yaml":   strings.NewReplacer("name: gadget}", "name: typo}", "object.spec.size > 1", "object.spec.szie > 1").Replace(gadgetRule),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig())
	readyz, poll := probing(t, probes, 30*time.Second)

	// The installed CRD types the trigger: the typo is found at start.
	poll("the typo reported and the good rule running", func() bool {
		b := readyz()
		return strings.Contains(b, "rule gadget: running") &&
			strings.Contains(b, `typo.yaml:6:21: rule "typo": spec.when: recheck.syncloop.dev/v1.Gadget.spec has no field "szie" (did you mean "size"?)`)
	})

	// plan types rules by the cluster's schemas too.
	code, _, errOut := syncloop(t, "plan", "-f", filepath.Join(dir, "typo.yaml"), "--kubeconfig", env.Kubeconfig())
	if code != 1 || !strings.Contains(errOut, `recheck.syncloop.dev/v1.Gadget.spec has no field "szie" (did you mean "size"?)`) {
		t.Errorf("plan of the typo: exit %d, stderr %q", code, errOut)
	}

	// Values are converted by the schema: creationTimestamp is a timestamp.
	gadgets := dc.Resource(schema.GroupVersionResource{Group: "recheck.syncloop.dev", Version: "v1", Resource: "gadgets"}).Namespace(ns)
	g := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "recheck.syncloop.dev/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g"}, "spec": map[string]any{"size": int64(3)},
	}}
	if _, err := gadgets.Create(ctx, g, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := func() map[string]string {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "g", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data
	}
	poll("the gadget's ConfigMap", func() bool { d := data(); return d["size"] == "3" && d["age"] == "true" })

	// spec.size renamed: the rule no longer type-checks; its last good
	// version stays in force.
	install("count")
	poll("the rule reported against the changed CRD", func() bool {
		b := readyz()
		return strings.Contains(b, `gadget.yaml:6:21: rule "gadget": spec.when: recheck.syncloop.dev/v1.Gadget.spec has no field "size"`) &&
			strings.Contains(b, `gadget.yaml:13:44: rule "gadget": spec.resources[0].template.data.size: ${string(object.spec.size)}: recheck.syncloop.dev/v1.Gadget.spec has no field "size" (its last good version stays in force)`)
	})
	if b := readyz(); !strings.Contains(b, "rule gadget: running") {
		t.Errorf("the last good version is not running:\n%s", b)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "g", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// (The API server now prunes spec.size from the Gadget, so the last
	// good version's `when` fails for it: nothing is recreated.)

	// spec.size back, next to spec.szie: both rules load.
	install("size", "szie")
	poll("both rules loaded", func() bool {
		b := readyz()
		return strings.Contains(b, "rule gadget: running") && strings.Contains(b, "rule typo: running") && !strings.Contains(b, "file ")
	})
	if _, err := gadgets.Patch(ctx, "g", "application/merge-patch+json", []byte(`{"spec":{"size":4}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("the ConfigMap made by the rule compiled against the new schema", func() bool { return data()["size"] == "4" })
}

// TestValidateTypes: validate, offline, rejects with the right line a
// misspelt trigger field (built-in kind and a CRD in the same file), a
// forEach over a string, an unknown template field and a mistyped template
// value — and accepts the well-typed rule beside them.
func TestValidateTypes(t *testing.T) {
	rule := func(name, watch, body string) string {
		return "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: " + name + "}\nspec:\n  watch: " + watch + "\n" + body
	}
	cm := "  resources:\n    - id: cm\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}}\n"
	deploy := "{apiVersion: apps/v1, kind: Deployment}"
	docs := []string{
		gadgetCRD("size"),
		rule("builtin", deploy, "  when: object.spec.replicsa > 1\n"+cm),
		rule("crd", "{apiVersion: recheck.syncloop.dev/v1, kind: Gadget}", "  when: object.spec.szie > 1\n"+cm),
		rule("foreach", deploy, "  resources:\n    - id: cm\n      forEach: object.metadata.name\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}}\n"),
		rule("field", deploy, "  resources:\n    - id: cm\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}, datas: {}}\n"),
		rule("value", deploy, "  resources:\n    - id: d\n      template:\n        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: x, namespace: y}\n        spec: {replicas: \"${object.metadata.name}\"}\n"),
		rule("fine", deploy, "  when: object.spec.replicas > 1 && object.spec.template.spec.containers.exists(c, c.image.startsWith('nginx'))\n"+cm),
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := syncloop(t, "validate", "-f", path)
	want := []string{
		`:26:21: rule "builtin": spec.when: apps/v1.Deployment.spec has no field "replicsa" (did you mean "replicas"?)`,
		`:36:21: rule "crd": spec.when: recheck.syncloop.dev/v1.Gadget.spec has no field "szie" (did you mean "size"?)`,
		`:48:16: rule "foreach": spec.resources[0].forEach: must produce a list, but produces string`,
		`:58:86: rule "field": spec.resources[0].template.datas: unknown field "datas": ConfigMap has no such field (did you mean "data"?)`,
		`:71:26: rule "value": spec.resources[0].template.spec.replicas: wants an integer, the template gives a string`,
	}
	for _, w := range want {
		if !strings.Contains(errOut, path+w+"\n") {
			t.Errorf("stderr lacks %q; it is:\n%s", w, errOut)
		}
	}
	if code != 1 || strings.Count(errOut, "\n") != len(want)+1 || strings.Contains(errOut, `"fine"`) {
		t.Errorf("exit %d, stderr:\n%s", code, errOut)
	}
}

// TestScopesFromTheCluster: plan checks scopes at load by the cluster's
// discovery — a namespaced child without a namespace under a trigger whose
// cluster-scoped kind only the cluster knows is a load error with its
// place; offline the kind's scope is not known, and validate accepts it.
func TestScopesFromTheCluster(t *testing.T) {
	env := testenv.Get(t)
	dir := t.TempDir()
	crd := writeFile(t, dir, "crd.yaml", `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: realms.scopes.syncloop.dev}
spec:
  group: scopes.syncloop.dev
  scope: Cluster
  names: {plural: realms, singular: realm, kind: Realm, listKind: RealmList}
  versions:
    - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
`)
	if _, err := env.InstallCRDs(t.Context(), crd); err != nil {
		t.Fatal(err)
	}
	rulesPath := writeFile(t, dir, "rules.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: realm}
spec:
  watch: {apiVersion: scopes.syncloop.dev/v1, kind: Realm}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}"}
`)
	if code, out, errOut := syncloop(t, "validate", "-f", rulesPath); code != 0 {
		t.Fatalf("validate, offline: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut := syncloop(t, "plan", "-f", rulesPath, "--kubeconfig", env.Kubeconfig())
	want := rulesPath + `:11:19: rule "realm": spec.resources[0].template.metadata.namespace: ConfigMap is namespaced and the trigger (Realm) is cluster-scoped: set metadata.namespace`
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("plan: exit %d, stderr %q; want 1 and %s", code, errOut, want)
	}
}

// TestStartWithANewCRD: a rule over a CRD created just before syncloop
// starts — its schema not yet published — starts once, typed: the start
// waits for the schema instead of starting untyped and restarting the rule
// (not ready for a moment) when it appears.
func TestStartWithANewCRD(t *testing.T) {
	env := testenv.Get(t)
	dir := t.TempDir()
	crd := writeFile(t, dir, "crd.yaml", `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: beacons.fresh.syncloop.dev}
spec:
  group: fresh.syncloop.dev
  scope: Namespaced
  names: {plural: beacons, singular: beacon, kind: Beacon, listKind: BeaconList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, properties: {spec: {type: object, properties: {size: {type: integer}}}}}}
`)
	rulesPath := writeFile(t, dir, "rules.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: beacon}
spec:
  watch: {apiVersion: fresh.syncloop.dev/v1, kind: Beacon}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}"}
        data: {size: "${string(object.spec.size)}"}
`)
	if _, err := env.InstallCRDs(t.Context(), crd); err != nil {
		t.Fatal(err)
	}
	metrics, probes := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, []string{"run", "-f", rulesPath, "--kubeconfig", env.Kubeconfig(),
			"--metrics-bind-address", metrics, "--health-probe-bind-address", probes}, io.Discard, io.Discard)
	}()
	defer func() { cancel(); <-exited }()
	pollUntil(t, 60*time.Second, "syncloop ready", func() bool { return strings.Contains(httpGet("http://"+probes+"/readyz"), "rule beacon: running") })
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 30*time.Second, "the CRD's schema published", func() bool {
		paths, err := disco.OpenAPIV3().Paths()
		_, ok := paths["apis/fresh.syncloop.dev/v1"]
		return err == nil && ok
	})
	reloads := func() string {
		for _, l := range strings.Split(httpGet("http://"+metrics+"/metrics"), "\n") {
			if strings.HasPrefix(l, `syncloop_rules_reload_total{result="success"}`) {
				return strings.TrimSpace(strings.TrimPrefix(l, `syncloop_rules_reload_total{result="success"}`))
			}
		}
		return ""
	}
	// Were the rule started untyped, it would be checked again within a
	// few hundred milliseconds of the schema's publication, and restarted.
	reloaded := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 3*time.Second, true,
		func(context.Context) (bool, error) { return reloads() != "1", nil }) == nil
	if reloaded {
		t.Errorf("the rules were loaded again after start (syncloop_rules_reload_total{result=\"success\"} %s): the rule restarted", reloads())
	}
	if !strings.Contains(httpGet("http://"+probes+"/readyz"), "rule beacon: running") {
		t.Error("not ready after the schema's publication")
	}
}
