package render

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// scopes is a Scoper from a table, for rendering without a cluster.
type scopes map[string]bool // kind → namespaced

func (s scopes) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	ns, ok := s[gvk.Kind]
	if !ok {
		return false, fmt.Errorf("unknown kind %s", gvk.Kind)
	}
	return ns, nil
}

// Tenant is a custom kind whose scope a load does not know: what it renders
// is checked when rendered.
var testScopes = scopes{"ConfigMap": true, "Namespace": false, "ClusterRole": false, "App": true, "Tenant": false}

func parseRule(t *testing.T, doc string) *rules.Rule {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{CostLimit: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("rule.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return f.Rules[0]
}

func obj(apiVersion, kind, ns, name string, labels map[string]any) *unstructured.Unstructured {
	md := map[string]any{"name": name, "uid": "uid-" + name}
	if ns != "" {
		md["namespace"] = ns
	}
	if labels != nil {
		md["labels"] = labels
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": md}}
}

const appRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: app}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  when: "object.metadata.?labels.?skip.orValue('') != 'yes'"
  variables:
    - name: base
      expression: "object.metadata.name + '-cfg'"
  resources:
    - id: local
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${variables.base}"}
        data: {owner: "${object.metadata.name}"}
    - id: remote
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${variables.base}", namespace: elsewhere}
    - id: cluster
      when: "object.metadata.?labels.?cluster.orValue('') == 'yes'"
      template:
        apiVersion: rbac.authorization.k8s.io/v1
        kind: ClusterRole
        metadata: {name: "${object.metadata.namespace}-${object.metadata.name}"}
    - id: per-team
      forEach: "['a', 'b']"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "team-${item}-${index}"}
  status:
    local: "${children.?local.?data.?owner.orValue('none')}"
    teams: "${children['per-team'].map(c, c.metadata.name)}"
`

func TestRenderChildren(t *testing.T) {
	r := parseRule(t, appRule)
	trigger := obj("example.com/v1", "App", "shop", "web", map[string]any{"cluster": "yes"})
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*unstructured.Unstructured{}
	var order []string
	for _, c := range rd.Children {
		key := c.ResourceID + ":" + c.Object.GetNamespace() + "/" + c.Object.GetName()
		got[key] = c.Object
		order = append(order, key)
	}
	want := []string{"local:shop/web-cfg", "remote:elsewhere/web-cfg", "cluster:/shop-web", "per-team:shop/team-a-0", "per-team:shop/team-b-1"}
	if strings.Join(order, " ") != strings.Join(want, " ") {
		t.Fatalf("children %v, want %v", order, want)
	}

	for key, o := range got {
		l := o.GetLabels()
		if l[rules.LabelManagedBy] != "syncloop" || l[rules.LabelRule] != "app" || l[rules.LabelOwnerUID] != "uid-web" {
			t.Errorf("%s: labels %v", key, l)
		}
		a := o.GetAnnotations()
		if a[rules.AnnotationOwner] != "example.com/v1/App/shop/web" || a[rules.AnnotationResourceID] != strings.Split(key, ":")[0] {
			t.Errorf("%s: annotations %v", key, a)
		}
	}
	// An ownerReference only where Kubernetes allows one: same namespace.
	for key, wantRef := range map[string]bool{"local:shop/web-cfg": true, "remote:elsewhere/web-cfg": false, "cluster:/shop-web": false} {
		refs := got[key].GetOwnerReferences()
		if wantRef != (len(refs) == 1) {
			t.Errorf("%s: ownerReferences %v, want one: %v", key, refs, wantRef)
			continue
		}
		if wantRef {
			ref := refs[0]
			if ref.Kind != "App" || ref.APIVersion != "example.com/v1" || ref.Name != "web" || ref.UID != "uid-web" || ref.Controller == nil || !*ref.Controller {
				t.Errorf("%s: ownerReference %+v", key, ref)
			}
			// Content as SetOwnerReferences makes it: what the children
			// in clusters were hashed with (the applied-hash annotation).
			set := &unstructured.Unstructured{Object: map[string]any{}}
			set.SetOwnerReferences(refs)
			if want, got := set.Object["metadata"].(map[string]any)["ownerReferences"], got[key].Object["metadata"].(map[string]any)["ownerReferences"]; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: ownerReferences %#v, want as SetOwnerReferences makes them: %#v", key, got, want)
			}
		}
	}
	if got["local:shop/web-cfg"].Object["data"].(map[string]any)["owner"] != "web" {
		t.Errorf("data = %v", got["local:shop/web-cfg"].Object["data"])
	}

	status, err := rd.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(status) != "map[local:web teams:[team-a-0 team-b-1]]" {
		t.Errorf("status = %v", status)
	}
	// Status sees live children: one the cluster does not have is absent.
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Applier: applierFunc(func(c Child) (map[string]any, error) {
		if c.ResourceID == "local" {
			return nil, nil
		}
		return c.Object.Object, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	status, err = rd.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if status["local"] != "none" {
		t.Errorf("status.local with no live child = %v, want none", status["local"])
	}
}

func TestRenderWhen(t *testing.T) {
	r := parseRule(t, appRule)
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "shop", "web", map[string]any{"skip": "yes"}), Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	if !rd.Skipped || len(rd.Children) != 0 {
		t.Errorf("skipped %v with %d children, want skipped with none", rd.Skipped, len(rd.Children))
	}
	if s, err := rd.Status(context.Background()); s != nil || err != nil {
		t.Errorf("status of a skipped trigger = %v, %v", s, err)
	}
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "shop", "web", nil), Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rd.Children {
		if c.ResourceID == "cluster" {
			t.Error("resource with a false `when` rendered")
		}
	}
}

func TestClusterScopedTrigger(t *testing.T) {
	// A trigger of a kind whose scope is known only at run time: the
	// render finds what a load could not.
	doc := head + "  watch: {apiVersion: example.com/v1, kind: Tenant}\n" + `  resources:
    - id: defaulted
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}
`
	r := parseRule(t, doc)
	_, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "Tenant", "", "team-a", nil), Scoper: testScopes})
	want := `rule.yaml:9:17: rule "r": resource "defaulted": spec.resources[0].template.metadata.namespace: ConfigMap is namespaced and the trigger is cluster-scoped: set metadata.namespace`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v\nwant %s", err, want)
	}

	doc = head + watchNS + `  resources:
    - id: inside
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: "${object.metadata.name}"}}
`
	rd, err := Rule(context.Background(), Input{Rule: parseRule(t, doc), Trigger: obj("v1", "Namespace", "", "team-a", nil), Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	c := rd.Children[0].Object
	// A cluster-scoped owner may own objects in any namespace.
	if c.GetNamespace() != "team-a" || len(c.GetOwnerReferences()) != 1 || c.GetAnnotations()[rules.AnnotationOwner] != "v1/Namespace//team-a" {
		t.Errorf("child %v", c.Object["metadata"])
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name string
		spec string // after watch
		want string
	}{
		{"missing key", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${dyn(object).spec.name}", namespace: n}}
`, `rule.yaml:11:68: rule "r": resource "a": spec.resources[0].template.metadata.name: ${dyn(object).spec.name}: no such key: spec`},
		{"when not bool at run time", `  when: dyn(object.metadata.name)
` + cm, `rule.yaml:9:9: rule "r": spec.when: must produce a bool, produced string`},
		{"name renders empty", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${''}", namespace: n}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.name: must render to a non-empty string, rendered ""`},
		{"two children, one name", `  resources:
    - id: a
      forEach: "['x', 'x']"
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${item}", namespace: n}}
`, `rule.yaml:12:17: rule "r": resource "a": spec.resources[0].template: ConfigMap n/x rendered twice (also by resource "a")`},
		{"label not a string", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n, labels: {n: "${dyn(object.metadata.?generation.orValue(1))}"}}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.labels: values must be strings`},
		{"labels not a map", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n, labels: "${dyn('x')}"}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.labels: must be a map of strings, not string`},
		{"annotation not a string", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n, annotations: {n: "${dyn(1)}"}}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.annotations: values must be strings`},
		{"cluster-scoped child with namespace", `  resources:
    - id: a
      template: {apiVersion: example.com/v1, kind: Tenant, metadata: {name: a, namespace: n}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.namespace: Tenant is cluster-scoped: metadata.namespace must be empty, rendered "n"`},
		{"unknown kind", `  resources:
    - id: a
      template: {apiVersion: x.io/v1, kind: Thing, metadata: {name: a}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template: unknown kind Thing`},
		// A name or namespace is one segment of a request path: a trigger's
		// content cannot steer a write to another namespace, resource or
		// subresource.
		{"name with a slash", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${'victim/' + 'status'}", namespace: n}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.name: "victim/status" cannot be an object's name: may not contain '/'`},
		{"name climbing the path", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${'../../ns2/configmaps/' + 'x'}", namespace: n}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.name: "../../ns2/configmaps/x" cannot be an object's name: may not contain '/'`},
		{"name ..", `  resources:
    - id: a
      mode: patch
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${'.' + '.'}", namespace: n}}
`, `rule.yaml:12:17: rule "r": resource "a": spec.resources[0].template.metadata.name: ".." cannot be an object's name: may not be '..'`},
		{"namespace with a slash", `  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: "${'n/../' + 'kube-system'}"}}
`, `rule.yaml:11:17: rule "r": resource "a": spec.resources[0].template.metadata.namespace: "n/../kube-system" is not a namespace: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := parseRule(t, head+watchNS+tt.spec)
			_, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("v1", "Namespace", "", "team-a", nil), Scoper: testScopes})
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v\nwant %s", err, tt.want)
			}
			var re *RenderError
			if !errors.As(err, &re) || re.Rule != "r" {
				t.Errorf("error %T is not a *RenderError for rule r", err)
			}
		})
	}
}

// TestRenderCopiesMetadata: a child whose labels and annotations are the
// trigger's own maps gets syncloop's added to copies — the trigger, an
// object of the informer's cache, is not changed.
func TestRenderCopiesMetadata(t *testing.T) {
	r := parseRule(t, head+watchNS+`  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: n, labels: "${object.metadata.labels}", annotations: "${object.metadata.annotations}"}}
`)
	trigger := obj("v1", "Namespace", "", "team-a", map[string]any{"team": "a"})
	trigger.Object["metadata"].(map[string]any)["annotations"] = map[string]any{"note": "x"}
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	if got := trigger.GetLabels(); len(got) != 1 || got["team"] != "a" {
		t.Errorf("the trigger's labels became %v", got)
	}
	if got := trigger.GetAnnotations(); len(got) != 1 || got["note"] != "x" {
		t.Errorf("the trigger's annotations became %v", got)
	}
	child := rd.Children[0].Object
	if l := child.GetLabels(); l["team"] != "a" || l[rules.LabelRule] != "r" || l[rules.LabelManagedBy] != rules.ManagedByValue {
		t.Errorf("child labels = %v", l)
	}
	if a := child.GetAnnotations(); a["note"] != "x" || a[rules.AnnotationOwner] == "" {
		t.Errorf("child annotations = %v", a)
	}
}

func TestRenderCostLimit(t *testing.T) {
	r := parseRule(t, head+watchNS+`  resources:
    - id: a
      forEach: "lists.range(1000).map(a, lists.range(1000).map(b, a*b)).flatten()"
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "x-${item}", namespace: n}}
`)
	_, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("v1", "Namespace", "", "team-a", nil), Scoper: testScopes})
	if !errors.Is(err, expr.ErrCostLimit) {
		t.Fatalf("err = %v, want one wrapping ErrCostLimit", err)
	}
	if !strings.HasPrefix(err.Error(), `rule.yaml:11:16: rule "r": resource "a": spec.resources[0].forEach: CEL cost limit exceeded`) {
		t.Errorf("err = %v", err)
	}
}

// TestRenderMaxChildren: a forEach may not make one trigger the owner of
// more than MaxChildren children, counted over all resources.
func TestRenderMaxChildren(t *testing.T) {
	r := parseRule(t, head+watchNS+`  resources:
    - id: a
      forEach: "lists.range(int(object.metadata.labels.a))"
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "a-${item}", namespace: n}}
    - id: b
      forEach: "lists.range(int(object.metadata.labels.b))"
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "b-${item}", namespace: n}}
`)
	at := func(a, b int) *unstructured.Unstructured {
		return obj("v1", "Namespace", "", "team-a", map[string]any{"a": fmt.Sprint(a), "b": fmt.Sprint(b)})
	}
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: at(MaxChildren-1, 1), Scoper: testScopes})
	if err != nil || len(rd.Children) != MaxChildren {
		t.Fatalf("at the limit: %v children, err %v", len(rd.Children), err)
	}
	_, err = Rule(context.Background(), Input{Rule: r, Trigger: at(MaxChildren, 1), Scoper: testScopes})
	if err == nil || !strings.HasPrefix(err.Error(), `rule.yaml:14:16: rule "r": resource "b": spec.resources[1].forEach: 10001 children, more than the 10000 one trigger may have`) {
		t.Errorf("over the limit: err = %v", err)
	}
}

const lookupRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: pull}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  lookups:
    - id: source
      apiVersion: v1
      kind: Secret
      namespace: platform
      name: "${object.metadata.?annotations.?secret.orValue('registry')}"
    - id: peers
      apiVersion: v1
      kind: Namespace
      labelSelector: "team=${object.metadata.labels.team}"
    - id: own
      apiVersion: v1
      kind: ConfigMap
      namespace: "${object.metadata.name}"
  resources:
    - id: copy
      when: lookups.source != null
      template:
        apiVersion: v1
        kind: Secret
        metadata: {name: registry, namespace: "${object.metadata.name}"}
        data: ${lookups.source.data}
    - id: peers
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: peers, namespace: "${object.metadata.name}"}
        data:
          peers: "${lookups.peers.map(n, n.metadata.name).join(',')}"
          own: "${string(size(lookups.own))}"
`

// TestRenderLookups: a lookup by name is the object or null, a list is
// sorted by namespace and name and selects by its templated selector and
// namespace; the offline lookuper reads the objects given.
func TestRenderLookups(t *testing.T) {
	r := parseRule(t, lookupRule)
	secret := obj("v1", "Secret", "platform", "registry", nil)
	secret.Object["data"] = map[string]any{".dockerconfigjson": "e30="}
	other := obj("v1", "Secret", "elsewhere", "registry", nil)
	other.Object["data"] = map[string]any{"wrong": "eA=="}
	objects := Objects{
		obj("v1", "Namespace", "", "b", map[string]any{"team": "x"}),
		obj("v1", "Namespace", "", "a", map[string]any{"team": "x"}),
		obj("v1", "Namespace", "", "c", map[string]any{"team": "y"}),
		other, secret,
		obj("v1", "ConfigMap", "a", "one", nil),
		obj("v1", "ConfigMap", "a", "two", nil),
		obj("v1", "ConfigMap", "b", "three", nil),
	}
	scopes := scopes{"Secret": true, "Namespace": false, "ConfigMap": true}
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: objects[0], Scoper: scopes, Lookups: objects, Clusters: objects, Recorded: Recorded{Objects: objects}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Children) != 2 {
		t.Fatalf("%d children, want the copy and the peers", len(rd.Children))
	}
	if got := rd.Children[0].Object.Object["data"]; fmt.Sprint(got) != "map[.dockerconfigjson:e30=]" {
		t.Errorf("copied data = %v, want the platform Secret's", got)
	}
	peers := rd.Children[1].Object.Object["data"].(map[string]any)
	if peers["peers"] != "a,b" || peers["own"] != "1" {
		t.Errorf("peers data = %v, want the team's namespaces sorted (a,b) and 1 ConfigMap of namespace b", peers)
	}

	// The source is absent: lookups.source is null, the copy is not wanted.
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: objects[2], Scoper: scopes, Lookups: objects[:3], Clusters: objects[:3], Recorded: Recorded{Objects: objects[:3]}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Children) != 1 || rd.Children[0].ResourceID != "peers" {
		t.Errorf("without the source: children %v, want only peers", rd.Children)
	}
	if got := rd.Children[0].Object.Object["data"].(map[string]any)["peers"]; got != "c" {
		t.Errorf("peers of team y = %q, want c", got)
	}

	// No lookuper at all is an error that names the lookup.
	if _, err := Rule(context.Background(), Input{Rule: r, Trigger: objects[0], Scoper: scopes}); err == nil || !strings.Contains(err.Error(), "spec.lookups[0]") {
		t.Errorf("render without objects to look up: %v", err)
	}
}

// TestRenderLookupErrors: what a lookup renders is checked per trigger.
func TestRenderLookupErrors(t *testing.T) {
	head := "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  watch: {apiVersion: v1, kind: Namespace}\n  lookups:\n"
	res := "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: x}}\n"
	tests := []struct{ name, lookup, want string }{
		{"name not a string", "    - {id: s, apiVersion: v1, kind: Secret, namespace: p, name: \"${dyn(object.metadata)}\"}\n",
			`rule.yaml:7:65: rule "r": spec.lookups[0].name: rendered a mapping, want a string`},
		// Kinds whose scope only the render knows (the load's checks find
		// these for built-in kinds).
		{"cluster-scoped kind with a namespace", "    - {id: s, apiVersion: example.com/v1, kind: Tenant, namespace: p, name: a}\n",
			`rule.yaml:7:7: rule "r": spec.lookups[0].namespace: Tenant is cluster-scoped: namespace must be empty, rendered "p"`},
		{"templated selector invalid", "    - {id: s, apiVersion: v1, kind: Namespace, labelSelector: \"a in (${object.metadata.name}\"}\n",
			`rule.yaml:7:7: rule "r": spec.lookups[0].labelSelector: "a in (team-a":`},
		{"templated namespace invalid", "    - {id: s, apiVersion: v1, kind: Secret, namespace: \"${object.metadata.name.upperAscii()}\", name: a}\n",
			`rule.yaml:7:7: rule "r": spec.lookups[0].namespace: rendered "TEAM-A", not a namespace`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := parseRule(t, head+tt.lookup+res)
			_, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("v1", "Namespace", "", "team-a", nil), Scoper: scopes{"Secret": true, "Namespace": false, "ConfigMap": true, "Tenant": false}, Lookups: Objects{}, Clusters: Objects{}, Recorded: Recorded{Objects: Objects{}}})
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant one starting with %s", err, tt.want)
			}
		})
	}
}

// patchRule patches the trigger's Namespace and owns a ConfigMap.
const patchRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: mark}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  resources:
    - id: ns
      mode: patch
      template:
        apiVersion: v1
        kind: Namespace
        metadata: {name: "${object.metadata.namespace}", labels: {has-apps: "true"}}
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}
`

// TestRenderPatch: a mode: patch resource renders only its template's
// fields — no labels, annotations or ownerReference of syncloop's (offline
// rendering lists it under patches, not children: TestOfflinePatches).
func TestRenderPatch(t *testing.T) {
	r := parseRule(t, patchRule)
	trigger := obj("example.com/v1", "App", "shop", "web", nil)
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes})
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Children) != 2 || !rd.Children[0].Patch || rd.Children[1].Patch {
		t.Fatalf("children %+v; want the patch then the owned child", rd.Children)
	}
	want := map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "shop", "labels": map[string]any{"has-apps": "true"}}}
	if got := rd.Children[0].Object.Object; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("patch = %v, want only the template's fields %v", got, want)
	}
	if rd.Children[1].Object.GetLabels()[rules.LabelRule] != "mark" {
		t.Error("the owned child lost syncloop's labels")
	}
}

// applierFunc is an Applier for tests.
type applierFunc func(Child) (map[string]any, error)

func (f applierFunc) Apply(_ context.Context, c Child) (map[string]any, error) { return f(c) }
func (applierFunc) Observed(Child) map[string]any                              { return nil }

// TestRenderRequiredLookup: while a required lookup's object is absent, the
// variables and resources that read it wait, the others render, the
// status that reads it waits, and Ready is WaitingForLookup<Id>; offline
// says so in a note.
func TestRenderRequiredLookup(t *testing.T) {
	r := parseRule(t, `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: r}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  lookups:
    - {id: db-config, apiVersion: v1, kind: ConfigMap, name: db, required: true}
    - {id: extra, apiVersion: v1, kind: ConfigMap, name: extra}
  variables:
    - {name: host, expression: "lookups['db-config'].data.host"}
    - {name: port, expression: "variables.host + ':5432'"}
    - {name: plain, expression: "'x'"}
  resources:
    - id: conn
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: conn}, data: {addr: "${variables.port}"}}
    - id: after
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: after}, data: {from: "${children.conn.metadata.name}"}}
    - id: free
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: free}, data: {v: "${variables.plain}"}}
  status:
    addr: ${variables.port}
`)
	app := obj("example.com/v1", "App", "shop", "a", nil)
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: app, Scoper: testScopes, Lookups: Objects{}, Clusters: Objects{}, Recorded: Recorded{Objects: Objects{}}})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range rd.Children {
		names = append(names, c.Object.GetName())
	}
	if strings.Join(names, ",") != "free" {
		t.Errorf("children %v; want only free (conn reads the lookup through two variables, after reads conn)", names)
	}
	if len(rd.Waiting()) != 2 || rd.Waiting()[0].WaitingForLookup == nil || rd.Waiting()[0].Resource.ID != "conn" {
		t.Errorf("waiting %+v; want conn waiting for the lookup, then after", rd.Waiting())
	}
	if st, err := rd.Status(context.Background()); st != nil || err != nil {
		t.Errorf("status %v, %v; want it to wait", st, err)
	}
	c := rd.Readiness()
	if c.Status || c.Reason != "WaitingForLookupDbConfig" || c.Message != `lookup "db-config" is required: ConfigMap shop/db does not exist; waiting: conn, after` {
		t.Errorf("Ready = %+v", c)
	}
	if len(rd.Notes) != 1 || !strings.Contains(rd.Notes[0], `lookup "db-config" is required and ConfigMap shop/db does not exist`) {
		t.Errorf("notes %q", rd.Notes)
	}

	db := obj("v1", "ConfigMap", "shop", "db", nil)
	db.Object["data"] = map[string]any{"host": "h"}
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: app, Scoper: testScopes, Lookups: Objects{db}, Clusters: Objects{db}, Recorded: Recorded{Objects: Objects{db}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Children) != 3 || rd.Children[0].Object.Object["data"].(map[string]any)["addr"] != "h:5432" || !rd.Readiness().Status {
		t.Errorf("with the object: %d children, Ready %+v", len(rd.Children), rd.Readiness())
	}
}

// BenchmarkRenderRule renders the benchmark's tenant rule — one ConfigMap
// a trigger, two interpolations — as a reconcile does, with an applier:
// what rendering costs a write besides the write.
func BenchmarkRenderRule(b *testing.B) {
	l, err := rules.NewLoader(expr.Options{CostLimit: 100_000})
	if err != nil {
		b.Fatal(err)
	}
	f, err := l.Parse("rule.yaml", []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: tenant-config}
spec:
  watch: {apiVersion: example.com/v1, kind: App, namespace: n}
  resources:
    - id: config
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "tenant-${object.metadata.name}"}
        data: {tier: "${object.spec.tier}"}
`))
	if err != nil {
		b.Fatal(err)
	}
	r := f.Rules[0]
	trigger := obj("example.com/v1", "App", "n", "t-00001", nil)
	trigger.Object["spec"] = map[string]any{"tier": "bronze"}
	ap := applierFunc(func(c Child) (map[string]any, error) { return c.Object.Object, nil })
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Rule(ctx, Input{Rule: r, Trigger: trigger, Scoper: testScopes, Applier: ap}); err != nil {
			b.Fatal(err)
		}
	}
}
