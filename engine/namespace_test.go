package engine

import (
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestWatchNamespace: limited to one namespace, syncloop runs as a user
// whose only rights are a Role in that namespace. Rules within it work,
// whether they name the namespace or not, lookups included; a rule watching
// or looking up a cluster-scoped kind fails with the reason; a child
// rendered, or a lookup templated, into another namespace fails its
// trigger. No request leaves the namespace and none is refused.
//
// API server: RBAC: a user whose only rights are a Role in one namespace.
func TestWatchNamespace(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	user := "ns-only-" + h.ns
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "syncloop", Namespace: h.ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
	if _, err := h.cs.RbacV1().Roles(h.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cs.RbacV1().RoleBindings(h.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "syncloop", Namespace: h.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "syncloop"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.config = h.env.ImpersonatedConfig(user, "system:authenticated")
	h.limitNS = h.ns

	h.createCM("named", map[string]string{"copy": "yes"}, nil)
	h.createCM("unnamed", map[string]string{"local": "yes"}, nil)
	h.createCM("escape", map[string]string{"escape": "yes"}, nil)
	h.createCM("peek", map[string]string{"peek": "yes"}, map[string]string{"where": "default"})
	h.createCM("source", nil, map[string]string{"v": "found"})
	h.startWith(h.loadRules(copyRule+`---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: local}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: local}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-local"}}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: escape}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: escape}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}", namespace: default}}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: cluster}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}", namespace: NS}}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: read}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: local}
  lookups:
    - {id: source, apiVersion: v1, kind: ConfigMap, name: source}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-read"}, data: {v: "${lookups.source.data.v}"}}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: peek}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: peek}
  lookups:
    - {id: other, apiVersion: v1, kind: ConfigMap, namespace: "${object.data.where}", name: x}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-peek"}}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: nodes}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: local}
  lookups:
    - {id: n, apiVersion: v1, kind: Node}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-nodes"}}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mark}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: local}
  resources:
    - id: ns
      mode: patch
      template: {apiVersion: v1, kind: Namespace, metadata: {name: NS, labels: {marked: "yes"}}}
`), false)

	h.eventually("the children of the rules within the namespace", func() bool {
		_, a := h.configMap(h.ns, "named-copy")
		_, b := h.configMap(h.ns, "unnamed-local")
		read, c := h.configMap(h.ns, "unnamed-read")
		return a && b && c && read.Data["v"] == "found"
	})
	failed := func(rule, detail string) func() bool {
		return func() bool {
			for _, s := range h.engine.States() {
				if s.Rule == rule {
					return s.State == StateFailed && strings.Contains(s.Detail, detail)
				}
			}
			return false
		}
	}
	h.eventually("the cluster-scoped rule to fail with the reason", failed("cluster", "it watches Namespace, which is cluster-scoped, but syncloop is limited to namespace"))
	h.eventually("the rule looking up Nodes to fail with the reason", failed("nodes", `lookup "n" reads Node, which is cluster-scoped, but syncloop is limited to namespace`))
	h.eventually("the rule patching Namespaces to fail with the reason", failed("mark", `resource "ns" patches Namespace, which is cluster-scoped, but syncloop is limited to namespace`))
	h.waitForFailed("escape", `is outside namespace "`+h.ns+`"`)
	h.waitForFailed("peek", `reads ConfigMap in namespace default, outside namespace "`+h.ns+`"`)
	prefix := "/api/v1/namespaces/" + h.ns + "/"
	for _, r := range h.counter.Requests(nil) {
		if r.Status == 403 {
			t.Errorf("refused: %s %s", r.Method, r.Path)
		}
		if classify(r) != "discovery" && !strings.HasPrefix(r.Path, prefix) {
			t.Errorf("a request outside the namespace: %s %s?%s", r.Method, r.Path, r.Query)
		}
	}
}
