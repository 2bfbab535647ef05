package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestKroFunctions: a rule written with kro's CEL functions — a name and
// a port seeded from the trigger's uid, a checksum, a merged map, a list
// edited at an index — runs on the cluster, and what it writes is what
// kro would have: the seeded values derived from the seed as kro derives
// them (computed here from the seed's SHA-256), so that a rule ported
// from kro keeps the names and ports kro gave its objects.
func TestKroFunctions(t *testing.T) {
	env, cs, _ := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "kro-fn")
	dir := t.TempDir()
	writeFile(t, dir, "kro.yaml", fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: kro-functions}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: %s, labelSelector: kro-fn}
  resources:
    - id: out
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${random.seededString(6, object.metadata.uid)}"}
        data:
          port: "${string(random.seededInt(30000, 32768, object.metadata.uid))}"
          checksum: "${base64.encode(hash.sha256(object.data.config))}"
          labels: "${json.marshal({'app': 'web'}.merge(json.unmarshal(object.data.extra)))}"
          order: "${cel.bind(l, ['a', 'c'], json.marshal(lists.insertAtIndex(l, 1, 'b')))}"
`, ns))
	_, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	trigger, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "t", Labels: map[string]string{"kro-fn": "yes"}},
		Data: map[string]string{"config": "replicas: 3", "extra": `{"tier": "gold"}`}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seed := sha256.Sum256([]byte(trigger.UID))
	name := make([]byte, 6)
	for i := range name {
		name[i] = "0123456789abcdefghijklmnopqrstuvwxyz"[binary.BigEndian.Uint32(seed[4*i:])%36]
	}
	sum := sha256.Sum256([]byte("replicas: 3"))
	want := map[string]string{
		"port":     fmt.Sprint(30000 + binary.BigEndian.Uint64(seed[:8])%2768),
		"checksum": base64.StdEncoding.EncodeToString(sum[:]),
		"labels":   `{"app":"web","tier":"gold"}`,
		"order":    `["a","b","c"]`,
	}
	var got *corev1.ConfigMap
	_, poll := probing(t, probes, 30*time.Second)
	poll("the child named from the seed", func() bool {
		got, err = cs.CoreV1().ConfigMaps(ns).Get(ctx, "t-"+string(name), metav1.GetOptions{})
		return err == nil
	})
	if fmt.Sprint(got.Data) != fmt.Sprint(want) {
		t.Errorf("the child's data %v, want %v", got.Data, want)
	}
}

// TestStatusAfterFailedApply: when one child's apply fails (an immutable
// ConfigMap changed), the trigger's status is still written from what is
// observed — the failed child read as it is in the cluster, the others
// as applied — so a collection's size follows the collection, as kro's
// status does; Ready is False with the failure. Before, the failed child
// was missing from children: a list's size lost it.
func TestStatusAfterFailedApply(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "status-fail")
	dir := t.TempDir()
	writeFile(t, dir, "bundle.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bundle}
spec:
  api:
    apiVersion: statusfail.syncloop.dev/v1
    kind: Bundle
    spec:
      parts: "[]Part"
    types:
      Part:
        name: string | required=true
        value: string | required=true
  resources:
    - id: parts
      forEach: object.spec.parts
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${item.name}"}
        immutable: true
        data: {value: "${item.value}"}
  status:
    parts: ${size(children.parts)}
    values: ${children.parts.map(c, c.data.value)}
`)
	_, probes := runInProcess(t, "-f", dir, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns)
	_, poll := probing(t, probes, 60*time.Second)
	bundles := dc.Resource(schema.GroupVersionResource{Group: "statusfail.syncloop.dev", Version: "v1", Resource: "bundles"}).Namespace(ns)
	part := func(name, value string) any { return map[string]any{"name": name, "value": value} }
	poll("the kind served", func() bool {
		_, err := bundles.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "statusfail.syncloop.dev/v1", "kind": "Bundle",
			"metadata": map[string]any{"name": "b"}, "spec": map[string]any{"parts": []any{part("a", "1"), part("b", "1")}}}}, metav1.CreateOptions{})
		return err == nil
	})
	status := func() (map[string]any, map[string]any) {
		b, err := bundles.Get(ctx, "b", metav1.GetOptions{})
		if err != nil {
			return nil, nil
		}
		st, _ := b.Object["status"].(map[string]any)
		conds, _, _ := unstructured.NestedSlice(b.Object, "status", "conditions")
		for _, c := range conds {
			if c := c.(map[string]any); c["type"] == "Ready" {
				return st, c
			}
		}
		return st, nil
	}
	poll("two parts in status", func() bool { st, _ := status(); return st != nil && fmt.Sprint(st["parts"]) == "2" })

	// a's value changes (its ConfigMap is immutable: the apply fails), c
	// is new (applied).
	b, err := bundles.Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Object["spec"] = map[string]any{"parts": []any{part("a", "2"), part("b", "1"), part("c", "1")}}
	if _, err := bundles.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll("c applied", func() bool {
		_, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "b-c", metav1.GetOptions{})
		return err == nil
	})
	poll("the status to follow the three parts there, a as it is", func() bool {
		st, ready := status()
		return st != nil && fmt.Sprint(st["parts"]) == "3" && fmt.Sprint(st["values"]) == "[1 1 1]" &&
			ready != nil && ready["status"] == "False" && ready["reason"] == "ReconcileFailed" && strings.Contains(fmt.Sprint(ready["message"]), "immutable")
	})
}
