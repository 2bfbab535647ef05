package rules

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/internal/testenv"
)

// loadAPIRule loads testdata/api/app.yaml.
func loadAPIRule(t *testing.T) (*Set, *Rule) {
	t.Helper()
	set, err := newLoader(t).Load(filepath.Join("testdata", "api", "app.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return set, set.Get("app")
}

// TestAPIRuleCRD: a rule with spec.api watches its kind, and its CRD —
// names derived, spec from the simple schema, status typed from the
// status template, Ready and Age columns — is the golden file's.
func TestAPIRuleCRD(t *testing.T) {
	set, r := loadAPIRule(t)
	if r.Watch.GVK != (schema.GroupVersionKind{Group: "example.syncloop.dev", Version: "v1", Kind: "App"}) || r.API.Plural != "apps" || r.API.Singular != "app" || !r.API.Namespaced {
		t.Errorf("watch %v, names %s/%s, namespaced %v", r.Watch.GVK, r.API.Plural, r.API.Singular, r.API.Namespaced)
	}
	got, err := sigsyaml.Marshal(r.CRD().Object)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "api", "app.crd.golden.yaml"), "CRD", got)
	st := r.API.Status.Properties
	for field, typ := range map[string]string{"readyReplicas": "integer", "address": "string", "available": "boolean",
		"rollout": "array", "images": "array", "tier": "string", "literal": "object", "conditions": "array"} {
		if s, ok := st[field]; !ok || len(s.Type) != 1 || s.Type[0] != typ {
			t.Errorf("status.%s: type %v, want %s", field, s.Type, typ)
		}
	}
	if cond := st["rollout"].Items.Schema; cond.Properties["lastUpdateTime"].Format != "date-time" {
		t.Errorf("status.rollout items: %v, want the Deployment's conditions", cond.Properties)
	}
	if lit := st["literal"].Properties; lit["version"].Type[0] != "integer" || lit["ratio"].Type[0] != "number" || lit["tags"].Items.Schema.Type[0] != "string" {
		t.Errorf("status.literal: %v", lit)
	}
	if raw := st["raw"]; len(raw.Type) != 0 || raw.Extensions["x-kubernetes-preserve-unknown-fields"] != true {
		t.Errorf("status.raw (dyn): %v, want any value", raw)
	}
	var noted bool
	for _, f := range set.Files() {
		for _, n := range f.Notes {
			noted = noted || (n.Field == "spec.status.raw" && strings.Contains(n.Msg, "any value") && n.Pos.Line == 62)
		}
	}
	if !noted {
		t.Errorf("no note at line 62 that status.raw is any value: %v", set.Files()[0].Notes)
	}
}

// TestAPIRuleDefaults: Set.Default applies the kind's defaults to an
// instance as the API server would, nested and named types included, and
// leaves what is set and other kinds alone.
func TestAPIRuleDefaults(t *testing.T) {
	set, _ := loadAPIRule(t)
	app := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.syncloop.dev/v1", "kind": "App",
		"metadata": map[string]any{"name": "web"},
		"spec":     map[string]any{"image": "nginx", "port": int64(9000), "ingress": map[string]any{}, "limits": map[string]any{}}}}
	other := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "c"}}}
	out := set.Default([]*unstructured.Unstructured{app, other})
	spec := out[0].Object["spec"].(map[string]any)
	if spec["replicas"] != int64(1) || spec["port"] != int64(9000) || spec["tier"] != "bronze" ||
		spec["ingress"].(map[string]any)["enabled"] != false || spec["limits"].(map[string]any)["cpu"] != "500m" {
		t.Errorf("defaulted spec %v", spec)
	}
	if _, ok := app.Object["spec"].(map[string]any)["replicas"]; ok {
		t.Error("the object given was modified")
	}
	if out[1] != other {
		t.Error("an object of another kind was copied")
	}
}

// TestAPIRuleErrors: every mistake in spec.api is a load error at its
// line and column.
func TestAPIRuleErrors(t *testing.T) {
	api := func(body string) string {
		return head + "  api:\n    apiVersion: example.com/v1\n    kind: App\n" + body + cm
	}
	const spec = "    spec:\n      replicas: integer | default=1\n"
	for _, tt := range []struct{ name, doc, want string }{
		{"no spec", api(""), `r.yaml:7:5: rule "r": spec.api.spec: required`},
		{"group without a dot", strings.Replace(api(spec), "example.com/v1", "example/v1", 1),
			`r.yaml:7:17: rule "r": spec.api.apiVersion: "example/v1": a custom kind's group is a domain with a dot`},
		{"core group", strings.Replace(api(spec), "example.com/v1", "v1", 1),
			`r.yaml:7:17: rule "r": spec.api.apiVersion: "v1": a custom kind's group is a domain with a dot`},
		{"reserved group", strings.Replace(api(spec), "example.com/v1", "apps.k8s.io/v1", 1),
			`r.yaml:7:17: rule "r": spec.api.apiVersion: group "apps.k8s.io" is reserved`},
		{"bad version", strings.Replace(api(spec), "example.com/v1", "example.com/1", 1),
			`r.yaml:7:17: rule "r": spec.api.apiVersion: version "1" is not a version`},
		{"lower-case kind", strings.Replace(api(spec), "kind: App", "kind: app", 1),
			`r.yaml:8:11: rule "r": spec.api.kind: "app" is not a kind`},
		{"bad scope", api("    scope: Global\n" + spec),
			`r.yaml:9:12: rule "r": spec.api.scope: must be Namespaced or Cluster, not "Global"`},
		{"bad plural", api("    plural: Apps\n" + spec),
			`r.yaml:9:13: rule "r": spec.api.plural: "Apps" is not a resource name`},
		{"short name twice", api("    shortNames: [ap, ap]\n" + spec),
			`r.yaml:9:22: rule "r": spec.api.shortNames[1]: "ap" is listed twice`},
		{"simple schema mistake", api("    spec:\n      replicas: intger\n"),
			`r.yaml:10:17: rule "r": spec.api.spec.replicas: unknown type "intger"`},
		{"defaults that break a validation", api("    spec:\n      replicas: integer | default=1\n    validations:\n      - rule: self.replicas > 2\n        message: more than two\n"),
			`r.yaml:9:5: rule "r": spec.api.spec: an object written without a spec gets {"replicas":1}, its fields' defaults, which the API server refuses: spec: more than two`},
		{"validation does not compile", api(spec + "    validations:\n      - rule: self.replicaz > 1\n"),
			`r.yaml:12:20: rule "r": spec.api.validations[0].rule: undefined field 'replicaz'`},
		{"validation not bool", api(spec + "    validations:\n      - rule: self.replicas\n"),
			`r.yaml:12:15: rule "r": spec.api.validations[0].rule: cel expression must evaluate to a bool`},
		{"validation without rule", api(spec + "    validations:\n      - message: m\n"),
			`r.yaml:12:9: rule "r": spec.api.validations[0].rule: required`},
		{"validation reason", api(spec + "    validations:\n      - rule: \"true\"\n        reason: Bad\n"),
			`r.yaml:13:17: rule "r": spec.api.validations[0].reason: "Bad" is not a reason`},
		{"column type", api(spec + "    printerColumns:\n      - {name: R, type: int, jsonPath: .spec.replicas}\n"),
			`r.yaml:12:25: rule "r": spec.api.printerColumns[0].type: must be string, integer, number, boolean or date, not "int"`},
		{"column path", api(spec + "    printerColumns:\n      - {name: R, type: integer, jsonPath: spec.replicas}\n"),
			`r.yaml:12:44: rule "r": spec.api.printerColumns[0].jsonPath: "spec.replicas": a column's path starts with a dot`},
		{"watch of another kind", strings.Replace(api(spec), head, head+watchNS, 1),
			`r.yaml:7:17: rule "r": spec.watch.apiVersion: "v1": the rule watches the kind it defines, example.com/v1 (spec.api); leave it out`},
		{"unknown field of spec.api", api(spec + "    version: v2\n"),
			`r.yaml:11:5: rule "r": spec.api: unknown field "version"`},
		{"expression reads a field the kind lacks", api(spec) + "  status:\n    r: ${object.spec.replics}\n",
			`r.yaml:18:22: rule "r": spec.status.r: ${object.spec.replics}: example.com/v1.App.spec has no field "replics" (did you mean "replicas"?)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newLoader(t).Parse("r.yaml", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant one with\n%s", err, tt.want)
			}
		})
	}
}

// TestAPIRuleKindTwice: two rules defining one kind — in one file or in
// two — is a load error naming both.
func TestAPIRuleKindTwice(t *testing.T) {
	doc := func(name, plural string) string {
		return strings.Replace(head, "name: r", "name: "+name, 1) + "  api:\n    apiVersion: example.com/v1\n    kind: App\n" + plural +
			"    spec:\n      a: string\n" + cm
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"a.yaml": doc("a", ""), "b.yaml": doc("b", "    plural: apps\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := newLoader(t).Load(dir)
	if err == nil || !strings.Contains(err.Error(), "b.yaml:7:5: rule \"b\": spec.api: example.com/v1 App (apps.example.com) is defined by rule a too, at "+filepath.Join(dir, "a.yaml")+":7:5") {
		t.Errorf("error %v", err)
	}
}

// TestAPIRuleServed: the generated CRD is one a real API server takes and
// serves as the rule says: defaults applied, the spec's validations and
// types enforced, the status subresource on with its inferred types, and
// `kubectl get`'s columns NAME, Replicas, Ready, Reason (wide) and Age.
func TestAPIRuleServed(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	_, r := loadAPIRule(t)
	dc := serveCRD(t, env, r.CRD().Object, "example.syncloop.dev/v1")
	apps := dc.Resource(schema.GroupVersionResource{Group: "example.syncloop.dev", Version: "v1", Resource: "apps"}).Namespace("default")
	app := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.syncloop.dev/v1", "kind": "App",
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	made, err := apps.Create(ctx, app("web", map[string]any{"image": "nginx", "limits": map[string]any{}}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if spec := made.Object["spec"].(map[string]any); spec["replicas"] != int64(1) || spec["tier"] != "bronze" || spec["limits"].(map[string]any)["cpu"] != "500m" {
		t.Errorf("served spec %v: the defaults are not applied", spec)
	}
	for _, bad := range []struct {
		name string
		spec map[string]any
		want string
	}{
		{"silver", map[string]any{"image": "x", "replicas": int64(20), "tier": "silver"}, "only gold apps run more than 10 replicas"},
		{"no-image", map[string]any{"replicas": int64(2)}, "spec.image: Required value"},
		{"bad-port", map[string]any{"image": "x", "port": "http"}, "spec.port: Invalid value"},
	} {
		if _, err := apps.Create(ctx, app(bad.name, bad.spec), metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: created with %v, want refused with %q", bad.name, err, bad.want)
		}
	}
	if _, err := apps.Create(ctx, app("gold", map[string]any{"image": "x", "replicas": int64(20), "tier": "gold"}), metav1.CreateOptions{}); err != nil {
		t.Errorf("a gold app of 20 replicas: %v", err)
	}

	// The status subresource, typed.
	made.Object["status"] = map[string]any{"readyReplicas": "three"}
	if _, err := apps.UpdateStatus(ctx, made, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "status.readyReplicas") {
		t.Errorf("a string readyReplicas: %v, want refused", err)
	}
	made.Object["status"] = map[string]any{"readyReplicas": int64(1), "address": "web.default.svc", "images": []any{"nginx"},
		"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "AllResourcesReady", "message": "m", "lastTransitionTime": "2026-12-01T10:00:00Z"}}}
	if _, err := apps.UpdateStatus(ctx, made, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("status update: %v", err)
	}

	// kubectl get's table.
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/apis/example.syncloop.dev/v1/namespaces/default/apps/web").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	var cols []string
	for _, c := range table.ColumnDefinitions {
		cols = append(cols, fmt.Sprintf("%s/%d", c.Name, c.Priority))
	}
	if got := strings.Join(cols, " "); got != "Name/0 Replicas/0 Ready/0 Reason/1 Age/0" || len(table.Rows) != 1 {
		t.Fatalf("columns %s, %d rows", got, len(table.Rows))
	}
	if cells := table.Rows[0].Cells; fmt.Sprint(cells[:4]) != "[web 1 True AllResourcesReady]" {
		t.Errorf("row %v", cells)
	}
}

// servedCRDs is a CRDSource of fixed CRDs.
type servedCRDs map[string]*unstructured.Unstructured

func (s servedCRDs) CRD(name string) (*unstructured.Unstructured, error) { return s[name], nil }

// TestAPIRuleBreakingChanges: against the CRD served from the rule's
// previous version, a change its objects could not follow is a load
// error at the field that makes it; a compatible one loads. A CRD that is
// not syncloop's is never taken over unless handed to the rule.
func TestAPIRuleBreakingChanges(t *testing.T) {
	const base = head + `  api:
    apiVersion: example.com/v1
    kind: App
    spec:
      image: string | required=true
      replicas: integer | default=1
      tier: string | enum=gold,silver default=silver
      ports: "[]integer"
      labels: map[string]string
` + cm
	prev := parseRule(t, strings.Replace(base, "name: r", "name: r", 1))
	served := prev.CRD()
	load := func(doc string, crd *unstructured.Unstructured, manage bool) error {
		l := newLoader(t)
		l.UseServedCRDs(servedCRDs{"apps.example.com": crd}, manage)
		_, err := l.Parse("r.yaml", []byte(doc))
		return err
	}
	for _, tt := range []struct{ name, from, to, want string }{
		{"field removed", "      ports: \"[]integer\"\n", "",
			`r.yaml:9:5: rule "r": spec.api.spec: breaking change to the served CustomResourceDefinition apps.example.com: field spec.ports is removed`},
		{"field retyped", "replicas: integer | default=1", "replicas: string | default=one",
			`r.yaml:11:7: rule "r": spec.api.spec.replicas: breaking change to the served CustomResourceDefinition apps.example.com: spec.replicas is retyped from integer to string`},
		{"items retyped", `ports: "[]integer"`, `ports: "[]string"`,
			`r.yaml:13:7: rule "r": spec.api.spec.ports: breaking change to the served CustomResourceDefinition apps.example.com: spec.ports is retyped from []integer to []string`},
		{"map values retyped", "labels: map[string]string", "labels: map[string]integer",
			`spec.labels is retyped from map[string]string to map[string]integer`},
		{"new required field without default", "      labels: map[string]string\n", "      labels: map[string]string\n      owner: string | required=true\n",
			`r.yaml:15:7: rule "r": spec.api.spec.owner: breaking change to the served CustomResourceDefinition apps.example.com: spec.owner is newly required and has no default`},
		{"existing field made required", "replicas: integer | default=1", "replicas: integer | required=true",
			`spec.replicas is newly required and has no default`},
		{"enum narrowed", "enum=gold,silver default=silver", "enum=silver default=silver",
			`r.yaml:12:7: rule "r": spec.api.spec.tier: breaking change to the served CustomResourceDefinition apps.example.com: the enum of spec.tier is narrowed: gold no longer allowed`},
		{"enum added", "image: string | required=true", "image: string | required=true enum=nginx",
			`spec.image gains an enum`},
		{"kind changed", "plural: x", "", ""}, // placeholder, replaced below
		{"scope changed", "    kind: App\n", "    kind: App\n    scope: Cluster\n",
			`r.yaml:9:12: rule "r": spec.api.scope: breaking change to the served CustomResourceDefinition apps.example.com: the scope changed from Namespaced`},
		{"version changed", "example.com/v1", "example.com/v2",
			`r.yaml:7:17: rule "r": spec.api.apiVersion: breaking change to the served CustomResourceDefinition apps.example.com: the kind served v1 and objects are stored in it: to serve v2, list both in spec.api.versions, with a conversion between them`},
		{"new optional field", "      labels: map[string]string\n", "      labels: map[string]string\n      owner: string\n", ""},
		{"new required field with a default", "      labels: map[string]string\n", "      labels: map[string]string\n      owner: string | required=true default=me\n", ""},
		{"enum widened", "enum=gold,silver default=silver", "enum=gold,silver,bronze default=silver", ""},
		{"bounds changed", "replicas: integer | default=1", "replicas: integer | default=1 maximum=5", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := strings.Replace(base, tt.from, tt.to, 1)
			if tt.name == "kind changed" {
				doc = strings.Replace(base, "    kind: App\n", "    kind: Application\n    plural: apps\n", 1)
				tt.want = `r.yaml:8:11: rule "r": spec.api.kind: breaking change to the served CustomResourceDefinition apps.example.com: the kind changed from App to Application`
			}
			if doc == base && tt.from != "" {
				t.Fatal("the change did not apply")
			}
			err := load(doc, served, true)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("a compatible change refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error:\n%v\nwant one with\n%s", err, tt.want)
			}
		})
	}

	// Not syncloop's: refused, unless handed to the rule; unmanaged, only
	// compared.
	foreign := served.DeepCopy()
	foreign.SetLabels(nil)
	if err := load(base, foreign, true); err == nil || !strings.Contains(err.Error(), "exists and is not this installation's of syncloop") {
		t.Errorf("a foreign CRD: %v", err)
	}
	foreign.SetAnnotations(map[string]string{AnnotationAdopt: "r"})
	if err := load(base, foreign, true); err != nil {
		t.Errorf("a CRD handed to the rule: %v", err)
	}
	other := served.DeepCopy()
	other.SetLabels(map[string]string{LabelManagedBy: ManagedByValue, LabelInstallation: "blue"})
	if err := load(base, other, true); err == nil || !strings.Contains(err.Error(), "is not this installation's") {
		t.Errorf("another installation's CRD: %v", err)
	}
	if err := load(base, foreign, false); err != nil {
		t.Errorf("unmanaged, the same CRD: %v", err)
	}
	if err := load(strings.Replace(base, "      labels: map[string]string\n", "", 1), foreign, false); err == nil ||
		!strings.Contains(err.Error(), "schema: openAPIV3Schema.properties.spec.properties.labels is served but not defined") {
		t.Errorf("unmanaged, a different CRD: %v", err)
	}
}
