package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/rules"
)

// gaugeVersions defines Gauge in v1alpha1 (size), the hub, and v1
// (replicas), stored in STORAGE and read by the rule in READ.
const gaugeVersions = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata:
  name: gauge
spec:
  api:
    apiVersion: migration.syncloop.dev/READ
    kind: Gauge
    versions:
      - name: v1alpha1
        hub: true
        storage: V1ALPHA1STORED
        spec:
          size: integer | default=1
      - name: v1
        storage: V1STORED
        spec:
          replicas: integer | default=1
        toHub: {spec: {size: "${object.spec.replicas}"}}
        fromHub: {spec: {replicas: "${object.spec.size}"}}
  status:
    seen: "${true}"
`

// gaugeOnlyV1 is Gauge with v1alpha1 gone.
const gaugeOnlyV1 = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata:
  name: gauge
spec:
  api:
    apiVersion: migration.syncloop.dev/v1
    kind: Gauge
    versions:
      - name: v1
        spec:
          replicas: integer | default=1
  status:
    seen: "${true}"
`

// gaugeRule is gaugeVersions stored in storage, read in read.
func gaugeRule(storage, read string) string {
	r := strings.NewReplacer("READ", read, "V1STORED", fmt.Sprint(storage == "v1"), "V1ALPHA1STORED", fmt.Sprint(storage == "v1alpha1"))
	return r.Replace(gaugeVersions)
}

// TestStorageMigration: 200 objects stored in v1alpha1; the rule moves
// the storage version to v1. Removing v1alpha1 is refused while objects
// are stored in it; syncloop rewrites every object, paced, is SIGKILLed
// half-way and the next process resumes where it stopped (it rewrites
// only the rest), then status.storedVersions holds v1 alone, and
// v1alpha1 may go.
//
// API server: a CRD converting through a webhook, a storage version
// change, updates re-encoding objects, status.storedVersions.
func TestStorageMigration(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "migration")
	hook := freeAddr(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "gauge.yaml")
	writeFile(t, dir, "gauge.yaml", gaugeRule("v1alpha1", "v1alpha1"))
	webhook := []string{"--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
		"--webhook-bind-address", hook, "--webhook-url", "https://" + hook + rules.WebhookPath}

	// The kind, stored in v1alpha1, and 200 objects of it.
	_, probes, stop := startInProcess(t, append([]string{"-f", file}, webhook...)...)
	readyz, poll := probing(t, probes, 60*time.Second)
	poll("the rule running", func() bool { return strings.Contains(readyz(), "rule gauge: running") })
	res := func(v string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "migration.syncloop.dev", Version: v, Resource: "gauges"}
	}
	const objects = 200
	for i := range objects {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "migration.syncloop.dev/v1alpha1", "kind": "Gauge",
			"metadata": map[string]any{"name": fmt.Sprintf("g-%03d", i)}, "spec": map[string]any{"size": int64(i)}}}
		if _, err := dc.Resource(res("v1alpha1")).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	crd := func() *unstructured.Unstructured {
		got, err := dc.Resource(crdGVR).Get(ctx, "gauges.migration.syncloop.dev", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	stored := func() []string {
		s, _, _ := unstructured.NestedStringSlice(crd().Object, "status", "storedVersions")
		return s
	}
	if s := stored(); fmt.Sprint(s) != "[v1alpha1]" {
		t.Fatalf("storedVersions %v before", s)
	}

	// Removing v1alpha1 while objects are stored in it: refused.
	early := writeFile(t, t.TempDir(), "gauge.yaml", gaugeOnlyV1)
	var stderr strings.Builder
	if code := runContext(ctx, []string{"plan", "-f", early, "--kubeconfig", env.Kubeconfig()}, io.Discard, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "version v1alpha1 is removed while objects may still be stored in it (status.storedVersions: v1alpha1)") {
		t.Errorf("removing v1alpha1 early: exit %d, %s", code, stderr.String())
	}

	// The plan of moving the storage version, while the webhook serves.
	var stdout strings.Builder
	stderr.Reset()
	moved := writeFile(t, t.TempDir(), "gauge.yaml", gaugeRule("v1", "v1"))
	planCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if code := runContext(planCtx, []string{"plan", "-f", moved, "--kubeconfig", env.Kubeconfig(), "--webhook-url", "https://" + hook + rules.WebhookPath}, &stdout, &stderr); code != 2 ||
		!strings.Contains(stdout.String(), "> migrate apiextensions.k8s.io/v1 CustomResourceDefinition gauges.migration.syncloop.dev  (rule gauge)\n    objects stored in v1alpha1 are rewritten in v1, the storage version") {
		t.Errorf("plan of the storage version's move: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	stop()

	// The storage version moves to v1: the first process is killed
	// half-way through the migration.
	writeFile(t, dir, "gauge.yaml", gaugeRule("v1", "v1"))
	progress := func() (p struct {
		To        string `json:"to"`
		Rewritten int    `json:"rewritten"`
	}) {
		_ = json.Unmarshal([]byte(crd().GetAnnotations()[manager.AnnotationMigration]), &p)
		return p
	}
	args := append([]string{"run", "-f", file, "--health-probe-bind-address=0", "--storage-migration-qps=40"}, webhook...)
	first := syncloopProcess(t, "first", append(args, "--metrics-bind-address=0")...)
	pollUntil(t, 60*time.Second, "the migration under way", func() bool { return progress().Rewritten >= 60 })
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	done := progress().Rewritten
	if done >= objects {
		t.Fatalf("killed after the migration: %d rewritten", done)
	}
	if s := stored(); fmt.Sprint(s) != "[v1alpha1 v1]" {
		t.Errorf("storedVersions %v mid-migration, want [v1alpha1 v1]", s)
	}
	t.Logf("killed with %d of %d objects rewritten", done, objects)
	var status strings.Builder
	if code := runContext(ctx, []string{"rollout", "status", "-n", ns, "--kubeconfig", env.Kubeconfig()}, &status, io.Discard); code != 0 ||
		!strings.Contains(status.String(), fmt.Sprintf("storage migration gauges.migration.syncloop.dev (rule gauge): to v1, %d objects rewritten; objects may be stored in v1alpha1, v1", done)) {
		t.Errorf("rollout status mid-migration: exit %d\n%s", code, status.String())
	}

	metrics := freeAddr(t)
	_ = syncloopProcess(t, "second", append(args, "--metrics-bind-address="+metrics)...)
	// Trimmed, then the progress dropped: a moment apart.
	pollUntil(t, 60*time.Second, "status.storedVersions trimmed to v1 and the progress dropped", func() bool {
		_, kept := crd().GetAnnotations()[manager.AnnotationMigration]
		return fmt.Sprint(stored()) == "[v1]" && !kept
	})
	var rewritten int
	for _, l := range strings.Split(httpGet("http://"+metrics+"/metrics"), "\n") {
		if strings.HasPrefix(l, `syncloop_storage_migration_objects_total{crd="gauges.migration.syncloop.dev",result="rewritten"}`) {
			_, _ = fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &rewritten)
		}
	}
	if rewritten == 0 || rewritten > objects-done {
		t.Errorf("the second process rewrote %d objects; %d were left: it did not resume", rewritten, objects-done)
	}
	// Every object reads in both versions, its value kept.
	got, err := dc.Resource(res("v1alpha1")).Namespace(ns).Get(ctx, "g-150", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 150 {
		t.Errorf("g-150 size %d after the migration", size)
	}

	// Now v1alpha1 may go.
	stderr.Reset()
	if code := runContext(ctx, []string{"plan", "-f", early, "--kubeconfig", env.Kubeconfig()}, io.Discard, &stderr); code == 1 {
		t.Errorf("removing v1alpha1 once nothing is stored in it: exit %d, %s", code, stderr.String())
	}
}
