package engine

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/render"
)

// grantRule turns a trigger's data.user into a ClusterRoleBinding to
// cluster-admin (the confused deputy a rule's identity must bound) and
// makes a note ConfigMap beside the trigger. SA stands for its
// spec.serviceAccountName line.
const grantRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: grant}
spec:
SA
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: grant=yes}
  resources:
    - id: note
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-note"}, data: {user: "${object.data.user}"}}
    - id: binding
      template:
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRoleBinding
        metadata: {name: "grant-NS-${object.metadata.name}"}
        roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
        subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "${object.data.user}"}]
`

// grantAs is grantRule acting as sa ("" syncloop's own identity).
func (h *harness) grantAs(sa string) *rules.Set {
	line := ""
	if sa != "" {
		line = "  serviceAccountName: " + sa + "\n  serviceAccountNamespace: NS"
	}
	return h.loadRules(strings.Replace(grantRule, "SA\n", line+"\n", 1))
}

// bindServiceAccount gives the ServiceAccount name of the test's namespace
// what rules say, by a Role there (namespaced) and a ClusterRole
// (cluster-wide, may be nil).
func (h *harness) bindServiceAccount(name string, namespaced, cluster []rbacv1.PolicyRule) {
	h.t.Helper()
	ctx := h.t.Context()
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: h.ns}}
	if _, err := h.cs.CoreV1().ServiceAccounts(h.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	if namespaced != nil {
		if _, err := h.cs.RbacV1().Roles(h.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: namespaced}, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		if _, err := h.cs.RbacV1().RoleBindings(h.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
	}
	if cluster != nil {
		cname := h.ns + "-" + name
		if _, err := h.cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: cname}, Rules: cluster}, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		if _, err := h.cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: cname},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cname}, Subjects: subject}, metav1.CreateOptions{}); err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() {
			_ = h.cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), cname, metav1.DeleteOptions{})
			_ = h.cs.RbacV1().ClusterRoles().Delete(context.Background(), cname, metav1.DeleteOptions{})
		})
	}
}

var manageConfigMaps = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}

// TestIdentityBoundsARule: a rule whose template turns a trigger's field
// into a ClusterRoleBinding to cluster-admin, acting as a ServiceAccount
// that may manage ConfigMaps in one namespace (and read
// ClusterRoleBindings), makes its ConfigMap and no binding: the refused
// write is a Failed Event on that trigger naming the ServiceAccount, the
// rule keeps running. The child informer of ConfigMaps lists in that one
// namespace, where the rule puts them. The same rule as syncloop's own
// identity makes the binding, as it always did.
//
// API server: impersonation and RBAC: the ServiceAccount's authorization,
// escalation prevention.
func TestIdentityBoundsARule(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	h.bindServiceAccount("cm-manager", manageConfigMaps,
		[]rbacv1.PolicyRule{{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterrolebindings"}, Verbs: []string{"get", "list", "watch"}}})
	binding := "grant-" + h.ns + "-mallory"
	t.Cleanup(func() {
		_ = h.cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding, metav1.DeleteOptions{})
	})

	h.createCM("mallory", map[string]string{"grant": "yes"}, map[string]string{"user": "mallory"})
	h.start(h.grantAs("cm-manager"))
	h.eventually("the note ConfigMap", func() bool {
		cm, ok := h.configMap(h.ns, "mallory-note")
		return ok && cm.Data["user"] == "mallory"
	})
	h.waitForEventWithin(30e9, "Failed", "mallory", `User "system:serviceaccount:`+h.ns+`:cm-manager" cannot patch resource "clusterrolebindings"`)
	if _, err := h.cs.RbacV1().ClusterRoleBindings().Get(ctx, binding, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the ClusterRoleBinding exists (or cannot be read: %v): the rule acted beyond its ServiceAccount", err)
	}
	states := h.engine.States()
	if len(states) != 1 || states[0].State != StateRunning || states[0].Identity != h.ns+"/cm-manager" {
		t.Errorf("states %+v, want grant running as %s/cm-manager", states, h.ns)
	}
	var keys []string
	for _, k := range h.engine.actors.keys() {
		keys = append(keys, k.String())
	}
	if want := "configmaps/v1 in " + h.ns + " labels " + childrenSelector("") + "," + rules.LabelRule + "=grant"; !slices.Contains(keys, want) {
		t.Errorf("informers %q: want the rule's own ConfigMap children listed in its namespace only (%s)", keys, want)
	}

	// As syncloop's own identity (the harness's admin), the rule is what
	// it always was: the binding is made.
	h.updates <- h.grantAs("")
	h.eventually("the ClusterRoleBinding made as syncloop's own identity", func() bool {
		crb, err := h.cs.RbacV1().ClusterRoleBindings().Get(ctx, binding, metav1.GetOptions{})
		return err == nil && len(crb.Subjects) == 1 && crb.Subjects[0].Name == "mallory"
	})
	if st := h.engine.States(); len(st) != 1 || st[0].Identity != "" {
		t.Errorf("states %+v, want grant as syncloop's own identity", st)
	}
}

// TestIdentityWithoutRights: a rule acting as a ServiceAccount that may
// not list its kinds waits, its state quoting the API server's refusal
// with the ServiceAccount's name, and writes nothing; a rule of syncloop's
// own identity watching the same objects runs beside it, on an informer of
// its own — none is shared across identities — while two rules of one
// identity share theirs.
//
// API server: RBAC refusing an impersonated list, quoted as the server
// says it.
func TestIdentityWithoutRights(t *testing.T) {
	h := newHarness(t)
	h.bindServiceAccount("nobody", nil, nil)
	h.createCM("t", map[string]string{"team": "x"}, nil)
	own := ruleYAML("own", "team=x", "")
	other := ruleYAML("own-too", "team=x", "")
	as := strings.Replace(ruleYAML("as-nobody", "team=x", ""), "spec:\n", "spec:\n  serviceAccountName: nobody\n  serviceAccountNamespace: NS\n", 1)
	h.startWith(h.loadRules(own+"---\n"+other+"---\n"+as), false)
	h.eventually("own and own-too to make their children", func() bool {
		_, a := h.configMap(h.ns, "t-own")
		_, b := h.configMap(h.ns, "t-own-too")
		return a && b
	})
	h.eventually("as-nobody to say why it waits", func() bool {
		for _, s := range h.engine.States() {
			if s.Rule == "as-nobody" {
				return s.State == StateSyncing && s.Identity == h.ns+"/nobody" &&
					strings.Contains(s.Detail, `User "system:serviceaccount:`+h.ns+`:nobody" cannot list resource "configmaps"`)
			}
		}
		return false
	})
	if _, ok := h.configMap(h.ns, "t-as-nobody"); ok {
		t.Error("the rule of a ServiceAccount without rights made its child")
	}
	if h.engine.Ready() {
		t.Error("the engine is ready with a rule that cannot list its triggers")
	}
	// own and own-too share the trigger informer and have a child
	// informer each; as-nobody has both of its own.
	if n := h.engine.Informers(); n != 5 {
		t.Errorf("%d informers, want 5 (syncloop's rules' shared trigger informer and their child informers, two of the ServiceAccount's): %v", n, h.engine.actors.keys())
	}
}

// TestIdentityNeverTakesOver: a rule acting as a ServiceAccount caches only
// its own children, yet never takes over another rule's: the child of
// syncloop's rule "mine" under the same name is found when the create-only
// apply fails, reported as a conflict on the trigger, and left as it is.
//
// API server: impersonation with RBAC, and apply preconditions.
func TestIdentityNeverTakesOver(t *testing.T) {
	h := newHarness(t)
	h.bindServiceAccount("cm-manager", manageConfigMaps, nil)
	h.createCM("t", map[string]string{"shared": "yes"}, nil)
	rule := func(name, sa string) string {
		return `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: ` + name + `}
spec:
` + sa + `  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: shared=yes}
  resources:
    - id: c
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-shared"}, data: {by: ` + name + `}}
`
	}
	h.start(h.loadRules(rule("mine", "")))
	h.eventually("mine's child", func() bool { _, ok := h.configMap(h.ns, "t-shared"); return ok })
	h.updates <- h.loadRules(rule("mine", "") + "---\n" + rule("theirs", "  serviceAccountName: cm-manager\n  serviceAccountNamespace: NS\n"))
	h.waitForEventWithin(30e9, render.ReasonChildConflict, "t", `is a child of rule "mine"`)
	cm, _ := h.configMap(h.ns, "t-shared")
	if cm.Labels[rules.LabelRule] != "mine" || cm.Data["by"] != "mine" {
		t.Errorf("the child of rule mine was taken over: labels %v, data %v", cm.Labels, cm.Data)
	}
}

// TestTenantRule: a tenant rule of the test's namespace, acting as that
// namespace's default ServiceAccount whose only rights are a Role there,
// works end to end: its triggers, children and lookups are all listed in
// the namespace, its children carry its <namespace>.<name>; a child whose
// namespace a trigger's field templates elsewhere fails that trigger only;
// and no request of the rule leaves the namespace.
//
// API server: a namespace Role as a ServiceAccount's only rights.
func TestTenantRule(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	if _, err := h.cs.RbacV1().Roles(h.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "team"}, Rules: append(manageConfigMaps,
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}})}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cs.RbacV1().RoleBindings(h.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "team"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "team"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "default", Namespace: h.ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"}, StringData: map[string]string{"user": "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.createCM("a", map[string]string{"app": "yes"}, nil)
	h.createCM("escape", map[string]string{"app": "yes"}, map[string]string{"ns": "default"})
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tl, err := l.ForTenant(h.ns)
	if err != nil {
		t.Fatal(err)
	}
	f, err := tl.Parse("configmap "+h.ns+"/team-rules app.yaml", []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, labelSelector: app=yes}
  lookups:
    - {id: creds, apiVersion: v1, kind: Secret, name: creds}
  resources:
    - id: settings
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-settings", namespace: "${object.?data.ns.orValue(object.metadata.namespace)}"}
        data: {user: "${lookups.creds.metadata.name}"}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(f)
	if err != nil {
		t.Fatal(err)
	}
	h.startWith(set, false)
	name := h.ns + ".app"
	h.eventually("the tenant rule's child", func() bool {
		cm, ok := h.configMap(h.ns, "a-settings")
		return ok && cm.Data["user"] == "creds" && cm.Labels[rules.LabelRule] == name
	})
	h.waitForEventWithin(30e9, "Failed", "escape", `a tenant rule of namespace "`+h.ns+`" stays in it: rendered "default"`)
	if _, ok := h.configMap("default", "escape-settings"); ok {
		t.Error("the tenant rule wrote into another namespace")
	}
	if st := h.engine.States(); len(st) != 1 || st[0].Rule != name || st[0].State != StateRunning || st[0].Identity != h.ns+"/default" {
		t.Errorf("states %+v, want %s running as %s/default", st, name, h.ns)
	}
	for _, r := range h.counter.Requests(nil) {
		if strings.HasPrefix(r.Path, "/api/v1/") || strings.HasPrefix(r.Path, "/apis/") && strings.Count(r.Path, "/") > 3 {
			if !strings.Contains(r.Path, "/namespaces/"+h.ns+"/") {
				t.Errorf("a request left the tenant's namespace: %s %s?%s (%d)", r.Method, r.Path, r.Query, r.Status)
			}
		}
		if r.Status == 403 {
			t.Errorf("a request was refused: %s %s?%s", r.Method, r.Path, r.Query)
		}
	}
}

// TestIdentitiesForgotten: an identity no rule acts as any more is
// forgotten with its informers, so teams' rules coming and going leave
// nothing behind.
//
// API server: impersonated informers started and stopped.
func TestIdentitiesForgotten(t *testing.T) {
	h := newHarness(t)
	h.bindServiceAccount("cm-manager", manageConfigMaps, nil)
	as := strings.Replace(ruleYAML("as", "team=x", ""), "spec:\n", "spec:\n  serviceAccountName: cm-manager\n  serviceAccountNamespace: NS\n", 1)
	own := ruleYAML("own", "team=x", "")
	h.start(h.loadRules(own + "---\n" + as))
	count := func() int {
		h.engine.actors.mu.Lock()
		defer h.engine.actors.mu.Unlock()
		return len(h.engine.actors.by)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d identities, want syncloop's own and cm-manager", n)
	}
	h.updates <- h.loadRules(own)
	h.eventually("cm-manager forgotten", func() bool { return count() == 1 && h.engine.Informers() == 2 })
}
