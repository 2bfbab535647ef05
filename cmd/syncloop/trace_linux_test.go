package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/testenv"
)

// shopRule defines the Shop kind; each Shop gets children in every state
// trace reports, as the test arranges them.
const shopRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: shop}
spec:
  api:
    apiVersion: trace.syncloop.dev/v1
    kind: Shop
    spec:
      copies: "[]string"
      optional: boolean | default=false
      v: string | default="1"
  lookups:
    - id: settings
      apiVersion: v1
      kind: ConfigMap
      name: settings
    - id: db
      apiVersion: v1
      kind: Secret
      name: "${object.metadata.name}-db"
      required: true
  resources:
    - id: plain
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-plain"}
        data: {tone: "${lookups.settings.data.tone}"}
    - id: gated
      readyWhen:
        - "self.metadata.?annotations[?'approved'].orValue('') == 'yes'"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-gated"}
    - id: after
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-after"}
        data: {gate: "${children.gated.metadata.name}"}
    - id: optional
      when: object.spec.optional
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-optional"}
    - id: taken
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-taken"}
    - id: drifty
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-drifty"}
        data: {v: "${object.spec.v}"}
    - id: copies
      forEach: object.spec.copies
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy-${item}"}
    - id: credentials
      template:
        apiVersion: v1
        kind: Secret
        metadata: {name: "${object.metadata.name}-credentials"}
        stringData: {password: "${string(lookups.db.data.password)}"}
  status:
    copies: ${size(children.copies)}
`

var shopGVR = schema.GroupVersionResource{Group: "trace.syncloop.dev", Version: "v1", Resource: "shops"}

// TestTrace: a Shop whose children syncloop made, then, with syncloop
// stopped, drifted, deleted, held by another object and no longer wanted;
// trace, reading the rule from its revision, reports each as it is — a
// golden text per state (ready, not ready and why, waiting for a resource
// and for a required lookup, excluded by when, in conflict, drifted and on
// which field, missing, not wanted), the lookups, the conditions and the
// Events — exits 3 while not ready and 0 once ready, and the same binary
// answers as a kubectl plugin.
func TestTrace(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "trace")
	file := writeFile(t, t.TempDir(), "shop.yaml", shopRule)
	mustCreate := func(obj *unstructured.Unstructured) {
		t.Helper()
		gvr := schema.GroupVersionResource{Version: "v1", Resource: strings.ToLower(obj.GetKind()) + "s"}
		if obj.GetKind() == "Shop" {
			gvr = shopGVR
		}
		if _, err := dc.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mustCreate(configMap(ns, "settings", map[string]any{"tone": "calm"}))
	mustCreate(configMap(ns, "web-taken", nil)) // someone else's
	stop := startSyncloop(t, "-f", file, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	pollUntil(t, 60*time.Second, "the Shop kind served", func() bool {
		_, err := dc.Resource(shopGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	mustCreate(&unstructured.Unstructured{Object: map[string]any{"apiVersion": "trace.syncloop.dev/v1", "kind": "Shop",
		"metadata": map[string]any{"name": "web"}, "spec": map[string]any{"copies": []any{"a", "b"}}}})
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-db"}, StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, 60*time.Second, "the Shop's children made", func() bool {
		for _, name := range []string{"web-plain", "web-gated", "web-drifty", "web-copy-a", "web-copy-b"} {
			if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
				return false
			}
		}
		_, err := cs.CoreV1().Secrets(ns).Get(ctx, "web-credentials", metav1.GetOptions{})
		return err == nil
	})
	pollUntil(t, 30*time.Second, "the Shop's status written", func() bool {
		shop, err := dc.Resource(shopGVR).Namespace(ns).Get(ctx, "web", metav1.GetOptions{})
		copies, _, _ := unstructured.NestedInt64(shop.Object, "status", "copies")
		conds, _, _ := unstructured.NestedSlice(shop.Object, "status", "conditions")
		return err == nil && copies == 2 && len(conds) > 0
	})
	stop()

	// What goes wrong while syncloop is away.
	drifty, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "web-drifty", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	drifty.Data["v"] = "edited"
	if _, err := cs.CoreV1().ConfigMaps(ns).Update(ctx, drifty, metav1.UpdateOptions{FieldManager: "someone"}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "web-plain", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Secrets(ns).Delete(ctx, "web-db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Resource(shopGVR).Namespace(ns).Patch(ctx, "web", "application/merge-patch+json", []byte(`{"spec":{"copies":["a"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	args := []string{"trace", "shop.trace.syncloop.dev", "web", "-n", ns, "--syncloop-namespace", ns, "--kubeconfig", env.Kubeconfig()}
	code, out, errOut := syncloop(t, args...)
	if code != 3 {
		t.Fatalf("trace of a Shop not ready exited %d, want 3: %s%s", code, out, errOut)
	}
	if !regexp.MustCompile(`\nEvents:\n  \S+ \S+: `).MatchString(out) {
		t.Errorf("trace shows no Events of the Shop:\n%s", out)
	}
	golden(t, filepath.Join("testdata", "trace", "states.txt"), normalizeTrace(out, ns))

	code, out, errOut = syncloop(t, append(args, "-o", "json")...)
	if code != 3 {
		t.Fatalf("trace -o json exited %d: %s", code, errOut)
	}
	var rep manager.TraceReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("trace -o json printed no report: %v\n%s", err, out)
	}
	if len(rep.Rules) != 1 || rep.Rules[0].Revision != 1 || rep.Rules[0].Hash == "" || rep.Ready {
		t.Errorf("trace -o json: rules %+v, ready %v; want rule shop at revision 1, not ready", rep.Rules, rep.Ready)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("trace printed a Secret's value:\n%s", out)
	}

	// Once the gate is approved, and the rest repaired by syncloop, every
	// resource is ready: exit 0. trace --watch, started before, prints each
	// report that changes until then, and exits 0.
	watched := make(chan int, 1)
	var watchOut, watchErr syncBuffer
	go func() {
		watched <- runContext(ctx, append(args, "--watch", "--timeout", "2m"), &watchOut, &watchErr)
	}()
	pollUntil(t, 30*time.Second, "trace --watch's first report", func() bool { return strings.Contains(watchOut.String(), "Conditions:") })
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-db"}, StringData: map[string]string{"password": "s3cret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "web-taken", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, "web-gated", "application/merge-patch+json", []byte(`{"metadata":{"annotations":{"approved":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	startSyncloop(t, "-f", file, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	pollUntil(t, 60*time.Second, "trace exits 0 once the Shop is ready, and syncloop has said so", func() bool {
		code, out, _ := syncloop(t, args...)
		return code == 0 && strings.Contains(out, "Ready=True")
	})
	_, out, _ = syncloop(t, args...)
	golden(t, filepath.Join("testdata", "trace", "ready.txt"), normalizeTrace(out, ns))
	if code := <-watched; code != 0 {
		t.Fatalf("trace --watch exited %d once the Shop was ready: %s%s", code, watchOut.String(), watchErr.String())
	}
	reports := strings.Split(watchOut.String(), "\n\nNAME ")
	first, last := reports[0], reports[len(reports)-1]
	if len(reports) < 2 || !strings.Contains(first, "WaitingForLookupDb") || !regexp.MustCompile(`rule shop revision 1 +- +True `).MatchString(last) {
		t.Errorf("trace --watch printed %d reports, the first not ready, the last ready; got:\n%s", len(reports), watchOut.String())
	}

	// As a kubectl plugin: kubectl finds kubectl-syncloop on PATH and
	// runs it with the words after "syncloop".
	kubectl, err := testenv.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(os.Args[0], filepath.Join(bin, "kubectl-syncloop")); err != nil {
		t.Fatal(err)
	}
	plugin := exec.CommandContext(ctx, kubectl, append([]string{"syncloop"}, append(args, "-o", "json")...)...)
	plugin.Env = append(os.Environ(), runAsSyncloop+"=1", "PATH="+bin+":"+os.Getenv("PATH"))
	if pout, err := plugin.Output(); err != nil || !strings.Contains(string(pout), `"rule": "shop"`) {
		t.Errorf("kubectl syncloop trace: %v\n%s", err, pout)
	}
	help := exec.CommandContext(ctx, kubectl, "syncloop", "trace", "--help")
	help.Env = plugin.Env
	if hout, err := help.Output(); err != nil || !strings.Contains(string(hout), "kubectl syncloop trace KIND[.GROUP] NAME") {
		t.Errorf("kubectl syncloop trace --help: %v\n%s", err, hout)
	}

	// Wide: when each child was made and last written by the rule.
	_, out, _ = syncloop(t, append(args, "-o", "wide")...)
	if !regexp.MustCompile(`(?m)^NAME +SYNCED +READY +STATUS +AGE +UPDATED +UID$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)ConfigMap/web-drifty \(\S+\) +True +- +\S+ +\d+[sm] ago +[0-9a-f-]{36}$`).MatchString(out) {
		t.Errorf("trace -o wide shows no ages and UIDs:\n%s", out)
	}
}

// startSyncloop runs syncloop in this process until the test ends or
// stop is called.
func startSyncloop(t *testing.T, args ...string) (stop func()) {
	t.Helper()
	_, _, stop = startInProcess(t, args...)
	t.Cleanup(stop)
	return stop
}

func configMap(ns, name string, data map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": ns}}}
	if data != nil {
		u.Object["data"] = data
	}
	return u
}

// normalizeTrace takes out what changes from run to run: the namespace,
// UIDs, the column widths they make, and the Events (how many a
// reconcile's retries make depends on timing).
func normalizeTrace(out, ns string) string {
	out, _, _ = strings.Cut(out, "\nEvents:\n")
	out = strings.ReplaceAll(out, ns, "NS")
	out = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`).ReplaceAllString(out, "UID")
	out = regexp.MustCompile(`(\S) {2,}`).ReplaceAllString(out, "$1  ")
	return out
}
