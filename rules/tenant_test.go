package rules

import (
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules/expr"
)

func tenantLoader(t *testing.T, ns string) *Loader {
	t.Helper()
	l, err := NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tl, err := l.ForTenant(ns)
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

const tenantDoc = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: app}
  lookups:
    - {id: creds, apiVersion: v1, kind: Secret, name: creds}
  resources:
    - id: c
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-c"}}
    - id: here
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: team-a}}
    - id: templated
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: y, namespace: "${object.data.ns}"}}
`

func TestTenant(t *testing.T) {
	f, err := tenantLoader(t, "team-a").Parse("cm.yaml", []byte(tenantDoc))
	if err != nil {
		t.Fatal(err)
	}
	r := f.Rules[0]
	if r.Name != "team-a.app" || r.Tenant != "team-a" || r.Watch.Namespace != "team-a" {
		t.Errorf("name %q, tenant %q, watch namespace %q", r.Name, r.Tenant, r.Watch.Namespace)
	}
	if r.Identity != (ServiceAccount{Namespace: "team-a", Name: "default"}) {
		t.Errorf("identity %+v, want team-a/default", r.Identity)
	}
	f, err = tenantLoader(t, "team-a").Parse("cm.yaml", []byte(strings.Replace(tenantDoc, "spec:\n", "spec:\n  serviceAccountName: deployer\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Rules[0].Identity; got != (ServiceAccount{Namespace: "team-a", Name: "deployer"}) {
		t.Errorf("identity %+v, want team-a/deployer", got)
	}
	// The same text as a platform rule is not confined.
	l, _ := NewLoader(expr.Options{})
	pf, err := l.Parse("cm.yaml", []byte(tenantDoc))
	if err != nil || pf.Rules[0].Name != "app" || pf.Rules[0].Watch.Namespace != "" || pf.Rules[0].Tenant != "" {
		t.Errorf("platform rule: %v %+v", err, pf)
	}
	if _, err := l.ForTenant("Team_A"); err == nil {
		t.Error("ForTenant took an invalid namespace")
	}
}

func TestTenantErrors(t *testing.T) {
	head := "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: app}\nspec:\n"
	cm := "      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}\n"
	for _, tc := range []struct{ name, doc, want string }{
		{"another namespace's child", head + "  watch: {apiVersion: v1, kind: ConfigMap}\n  resources:\n    - id: c\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: team-b}}\n",
			`cm.yaml:8:82: rule "app": spec.resources[0].template.metadata.namespace: a tenant rule of namespace "team-a" stays in it: it cannot make or patch objects in namespace "team-b"`},
		{"another namespace's Secret", head + "  watch: {apiVersion: v1, kind: ConfigMap}\n  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, namespace: team-b, name: creds}\n  resources:\n    - id: c\n" + cm,
			`cm.yaml:7:56: rule "app": spec.lookups[0].namespace: a tenant rule of namespace "team-a" stays in it: it cannot read namespace "team-b"`},
		{"another namespace's triggers", head + "  watch: {apiVersion: v1, kind: ConfigMap, namespace: team-b}\n  resources:\n    - id: c\n" + cm,
			`cm.yaml:5:55: rule "app": spec.watch.namespace: a tenant rule of namespace "team-a" stays in it: it cannot watch namespace "team-b"`},
		{"cluster-scoped trigger", head + "  watch: {apiVersion: v1, kind: Namespace}\n  resources:\n    - id: c\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: team-a}}\n",
			`spec.watch.kind: a tenant rule of namespace "team-a" stays in it: it cannot watch Namespace, which is cluster-scoped`},
		{"cluster-scoped child", head + "  watch: {apiVersion: v1, kind: ConfigMap}\n  resources:\n    - id: c\n      template: {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRoleBinding, metadata: {name: x}, roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\n",
			`spec.resources[0].template.kind: a tenant rule of namespace "team-a" stays in it: it cannot make or patch ClusterRoleBinding, which is cluster-scoped`},
		{"a cluster-scoped kind among a child's kinds", head + "  watch: {apiVersion: v1, kind: ConfigMap}\n  resources:\n    - id: c\n      kinds: [{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole}]\n      template: {apiVersion: rbac.authorization.k8s.io/v1, kind: \"${'ClusterRole'}\", metadata: {name: x}}\n",
			`spec.resources[0].template.kind: a tenant rule of namespace "team-a" stays in it: it cannot make or patch ClusterRole, which is cluster-scoped`},
		{"cluster-scoped lookup", head + "  watch: {apiVersion: v1, kind: ConfigMap}\n  lookups:\n    - {id: n, apiVersion: v1, kind: Node, name: a}\n  resources:\n    - id: c\n" + cm,
			`spec.lookups[0].kind: a tenant rule of namespace "team-a" stays in it: it cannot read Node, which is cluster-scoped`},
		{"another namespace's ServiceAccount", head + "  serviceAccountName: admin\n  serviceAccountNamespace: kube-system\n  watch: {apiVersion: v1, kind: ConfigMap}\n  resources:\n    - id: c\n" + cm,
			`cm.yaml:6:28: rule "app": spec.serviceAccountNamespace: a tenant rule of namespace "team-a" stays in it: it acts as a ServiceAccount of its namespace, not of "kube-system"`},
		{"a kind of its own", head + "  api: {apiVersion: example.syncloop.dev/v1, kind: App, spec: {image: string}}\n  resources:\n    - id: c\n" + cm,
			`spec.api: a tenant rule of namespace "team-a" stays in it: it cannot define a kind`},
		{"too long a name", strings.Replace(head, "name: app", "name: "+strings.Repeat("a", 60), 1) + "  watch: {apiVersion: v1, kind: ConfigMap}\n  resources:\n    - id: c\n" + cm,
			`metadata.name: a tenant rule is named <namespace>.<name>, which must be at most 63 characters`},
	} {
		_, err := tenantLoader(t, "team-a").Parse("cm.yaml", []byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.name, err, tc.want)
		}
	}
}
