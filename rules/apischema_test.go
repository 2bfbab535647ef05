package rules

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/kube-openapi/pkg/validation/spec"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite golden files")

// compileAPI compiles doc's spec and types (the body of a spec.api) as
// api.yaml, and returns the schema and the errors' lines.
func compileAPI(t *testing.T, doc string) (*spec.Schema, []string) {
	t.Helper()
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		t.Fatal(err)
	}
	d := &decoder{file: "api.yaml", lines: strings.Split(doc, "\n")}
	var specNode, typesNode *yaml.Node
	top := root.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		switch top.Content[i].Value {
		case "spec":
			specNode = top.Content[i+1]
		case "types":
			typesNode = top.Content[i+1]
		}
	}
	s := d.compileAPISchema(specNode, "spec.api.spec", typesNode, "spec.api.types")
	var errs []string
	for _, e := range d.errs {
		errs = append(errs, e.Error())
	}
	return s, errs
}

// appAPI is the schema of the App kind of the issue that asked for it.
const appAPI = `spec:
  image: string | required=true description="Container image"
  replicas: integer | default=1 minimum=0 maximum=50
  port: integer | default=8080 minimum=1 maximum=65535
  tier: string | enum=gold,silver,bronze default=bronze
  env: map[string]string
  ports: "[]integer"
  name: string | immutable=true pattern="^[a-z]+$" maxLength=20
  ingress:
    enabled: boolean | default=false
    host: string
  limits: Limits
  sidecars: "[]Sidecar"
  extra: object
types:
  Limits:
    cpu: string | default="500m"
    memory: string
  Sidecar:
    image: string | required=true
    args: "[]string"
`

// TestAPISchema: the App schema compiles to the OpenAPI v3 schema of the
// golden file: structural, defaults typed, required fields listed, named
// types inlined, immutable as a CEL transition rule.
func TestAPISchema(t *testing.T) {
	s, errs := compileAPI(t, appAPI)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	got, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "apischema.golden.json"), "schema", append(got, '\n'))
	if r := s.Properties["replicas"]; r.Default != int64(1) || *r.Minimum != 0 || *r.Maximum != 50 {
		t.Errorf("replicas: default %v (%T), range %v–%v", r.Default, r.Default, *r.Minimum, *r.Maximum)
	}
	if strings.Join(s.Required, ",") != "image" || strings.Join(s.Properties["sidecars"].Items.Schema.Required, ",") != "image" {
		t.Errorf("required %v, sidecars' %v", s.Required, s.Properties["sidecars"].Items.Schema.Required)
	}
}

// TestAPISchemaErrors: every mistake is an error at its line and column,
// in the characters of the type or marker that is wrong.
func TestAPISchemaErrors(t *testing.T) {
	for _, tt := range []struct{ name, doc, want string }{
		{"unknown type", "spec:\n  a: strin\n",
			`api.yaml:2:6: spec.api.spec.a: unknown type "strin": a type is string, integer, boolean, number, object, []T, map[string]T or one of spec.api.types (none declared)`},
		{"unknown element type", "spec:\n  a: \"[]Strin\"\n",
			`api.yaml:2:9: spec.api.spec.a: unknown type "Strin"`},
		{"map key", "spec:\n  a: map[int]string\n",
			`api.yaml:2:10: spec.api.spec.a: map keys are strings in Kubernetes objects: map[string]T, not map[int]`},
		{"no type", "spec:\n  a: \" | required=true\"\n",
			`api.yaml:2:8: spec.api.spec.a: the type is missing`},
		{"unknown marker", "spec:\n  a: string | requird=true\n",
			`api.yaml:2:15: spec.api.spec.a: unknown marker "requird" (markers: required, default, description, enum, minimum, maximum, minLength, maxLength, pattern, immutable, validation, uniqueItems, minItems, maxItems, listType, listMapKey)`},
		{"marker without value", "spec:\n  a: string | required\n",
			`api.yaml:2:15: spec.api.spec.a: marker "required" has no value`},
		{"bad bool", "spec:\n  a: string | required=yes\n",
			`api.yaml:2:24: spec.api.spec.a: marker required: "yes" is not true or false`},
		{"default of the wrong type", "spec:\n  a: integer | default=many\n",
			`api.yaml:2:24: spec.api.spec.a: marker default: "many" is not an integer`},
		{"default outside the enum", "spec:\n  tier: string | enum=gold,silver default=bronze\n",
			`api.yaml:2:43: spec.api.spec.tier: marker default: default bronze: bronze is not one of the enum ([gold silver])`},
		{"default out of range", "spec:\n  n: integer | maximum=3 default=4\n",
			`api.yaml:2:34: spec.api.spec.n: marker default: default 4: 4 is out of the range allowed`},
		{"enum on a bool", "spec:\n  b: boolean | enum=true\n",
			`api.yaml:2:21: spec.api.spec.b: marker enum: only strings and numbers take an enum, this is a boolean`},
		{"minimum on a string", "spec:\n  s: string | minimum=1\n",
			`api.yaml:2:23: spec.api.spec.s: marker minimum: only numbers take a minimum, this is a string`},
		{"minimum above maximum", "spec:\n  n: integer | minimum=5 maximum=2\n",
			`api.yaml:2:34: spec.api.spec.n: marker maximum: 2 is less than the minimum 5`},
		{"bad pattern", "spec:\n  s: string | pattern=\"(a\"\n",
			`api.yaml:2:23: spec.api.spec.s: marker pattern: "(a" is not a regular expression`},
		{"unterminated quote", "spec:\n  s: string | description=\"abc\n",
			`api.yaml:2:27: spec.api.spec.s: marker description: the quoted value does not end`},
		{"marker twice", "spec:\n  s: string | default=a default=b\n",
			`api.yaml:2:25: spec.api.spec.s: marker default given twice`},
		{"object default not JSON", "spec:\n  m: map[string]string | default=a\n",
			`api.yaml:2:34: spec.api.spec.m: marker default: the default of a map is JSON: "a" is not`},
		{"object default of the wrong shape", "spec:\n  m: map[string]integer | default={\"a\":\"b\"}\n",
			`api.yaml:2:35: spec.api.spec.m: marker default: default {"a":"b"}: a: want integer, not a string`},
		{"not a type", "spec:\n  a: 3\n",
			`api.yaml:2:6: spec.api.spec.a: must be a type such as "string | required=true", or a mapping of fields, not a number`},
		{"field twice", "spec:\n  a: string\n  a: integer\n",
			`api.yaml:3:3: spec.api.spec.a: field given twice`},
		{"recursive type", "spec:\n  n: Node\ntypes:\n  Node:\n    children: \"[]Node\"\n",
			`api.yaml:5:18: spec.api.types.Node: type "Node" refers to itself (Node → Node): a Kubernetes schema cannot be recursive`},
		{"minItems on a string", "spec:\n  s: string | minItems=1\n",
			`api.yaml:2:24: spec.api.spec.s: marker minItems: only lists take a minItems, this is a string`},
		{"maxItems below minItems", "spec:\n  l: \"[]string | minItems=3 maxItems=2\"\n",
			`api.yaml:2:38: spec.api.spec.l: marker maxItems: 2 is less than minItems 3`},
		{"negative maxItems", "spec:\n  l: \"[]string | maxItems=-1\"\n",
			`api.yaml:2:27: spec.api.spec.l: marker maxItems: "-1" is not a count (an integer, 0 or more)`},
		{"unique objects", "spec:\n  l: \"[]P | uniqueItems=true\"\ntypes:\n  P: {name: string}\n",
			`api.yaml:2:25: spec.api.spec.l: marker uniqueItems: only a list of strings, numbers or booleans is a set, this is a list of object: a list of objects is keyed with listType=map listMapKey=<field>`},
		{"unique and a map", "spec:\n  l: \"[]string | uniqueItems=true listType=map\"\n",
			`api.yaml:2:44: spec.api.spec.l: marker listType: listType=map contradicts uniqueItems=true (listType=set)`},
		{"unknown list type", "spec:\n  l: \"[]string | listType=bag\"\n",
			`api.yaml:2:27: spec.api.spec.l: marker listType: "bag" is not a list type: atomic, set or map`},
		{"map list without keys", "spec:\n  l: \"[]P | listType=map\"\ntypes:\n  P: {name: string | required=true}\n",
			`api.yaml:2:22: spec.api.spec.l: marker listType: a list of listType=map names the items' key with listMapKey=<field> (one or more)`},
		{"key without a map list", "spec:\n  l: \"[]P | listMapKey=name\"\ntypes:\n  P: {name: string | required=true}\n",
			`api.yaml:2:24: spec.api.spec.l: marker listMapKey: keys are for a list of listType=map, which this is not`},
		{"key not a field", "spec:\n  l: \"[]P | listType=map listMapKey=nam\"\ntypes:\n  P: {name: string | required=true}\n",
			`api.yaml:2:37: spec.api.spec.l: marker listMapKey: the items have no field "nam"`},
		{"key optional", "spec:\n  l: \"[]P | listType=map listMapKey=name\"\ntypes:\n  P: {name: string}\n",
			`api.yaml:2:37: spec.api.spec.l: marker listMapKey: the key "name" is neither required nor defaulted`},
		{"key twice", "spec:\n  l: \"[]P | listType=map listMapKey=name listMapKey=name\"\ntypes:\n  P: {name: string | required=true}\n",
			`api.yaml:2:53: spec.api.spec.l: marker listMapKey: "name" is a key already`},
		{"default not unique", "spec:\n  l: '[]string | uniqueItems=true default=[\"a\",\"a\"]'\n",
			`api.yaml:2:43: spec.api.spec.l: marker default: default ["a","a"]: "a" is in the list twice`},
		{"default with too many items", "spec:\n  l: '[]integer | maxItems=1 default=[1,2]'\n",
			`api.yaml:2:38: spec.api.spec.l: marker default: default [1,2]: 2 items is not a number of items allowed`},
		{"default missing a required field", "spec:\n  p: 'P | default={}'\ntypes:\n  P: {name: string | required=true}\n",
			`api.yaml:2:19: spec.api.spec.p: marker default: default {}: the required field "name" is missing`},
		{"empty validation", "spec:\n  s: 'string | validation=\"\"'\n",
			`api.yaml:2:27: spec.api.spec.s: marker validation: the rule is empty`},
		{"type named like a built-in", "spec:\n  a: string\ntypes:\n  string: {x: integer}\n",
			`api.yaml:4:3: spec.api.types.string: "string" cannot name a type`},
		{"unused type with a mistake", "spec:\n  a: string\ntypes:\n  T:\n    x: intger\n",
			`api.yaml:5:8: spec.api.types.T.x: unknown type "intger"`},
		// JSON, and so a CRD, holds no NaN or infinity, though ParseFloat
		// reads them.
		{"minimum NaN", "spec:\n  n: number | minimum=NaN\n",
			`api.yaml:2:23: spec.api.spec.n: marker minimum: "NaN" is not a finite number`},
		{"maximum Inf", "spec:\n  n: number | maximum=Inf\n",
			`api.yaml:2:23: spec.api.spec.n: marker maximum: "Inf" is not a finite number`},
		{"default -Inf", "spec:\n  n: number | default=-Inf\n",
			`api.yaml:2:23: spec.api.spec.n: marker default: "-Inf" is not a finite number`},
		{"enum infinity", "spec:\n  n: number | enum=1,infinity\n",
			`api.yaml:2:20: spec.api.spec.n: marker enum: "infinity" is not a finite number`},
		{"float default nan", "spec:\n  n: float | default=nan\n",
			`api.yaml:2:22: spec.api.spec.n: marker default: "nan" is not a finite number`},
		{"list nested too deep", "spec:\n  a: \"" + strings.Repeat("[]", 10_000) + "string\"\n",
			`api.yaml:2:73: spec.api.spec.a: the type nests more than 32 lists and maps deep`},
		{"map nested too deep", "spec:\n  a: \"" + strings.Repeat("map[string]", 40) + "string\"\n",
			`api.yaml:2:370: spec.api.spec.a: the type nests more than 32 lists and maps deep`},
		{"named types nested too deep", "spec:\n  a: T0\ntypes:\n" + chainedTypes(40, 1),
			`api.yaml:2:3: spec.api.spec: the schema nests more than 32 levels deep`},
		{"named types repeated into a huge schema", "spec:\n  a: T0\ntypes:\n" + chainedTypes(20, 4),
			`api.yaml:2:3: spec.api.spec: the schema has more than 10000 fields and types`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, errs := compileAPI(t, tt.doc)
			if s != nil || len(errs) == 0 || !strings.HasPrefix(errs[0], tt.want) {
				t.Errorf("errors %q (schema %v); want one starting %q", errs, s != nil, tt.want)
			}
		})
	}
}

// chainedTypes declares named types T0…T(n-1), each with fields fields
// of the next type: nested n deep, and fields^n fields in all once each
// use is written out, as a CRD writes it.
func chainedTypes(n, fields int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  T%d:\n", i)
		for f := range fields {
			if i == n-1 {
				fmt.Fprintf(&b, "    f%d: string\n", f)
			} else {
				fmt.Fprintf(&b, "    f%d: T%d\n", f, i+1)
			}
		}
	}
	return b.String()
}

// TestAPISchemaServed: a CustomResourceDefinition with the compiled App
// schema is accepted by a real API server (the schema is structural, the
// defaults fit it), which then applies the defaults to an instance that
// leaves them out and refuses instances that break a type, an enum, a
// range or immutability.
func TestAPISchemaServed(t *testing.T) {
	env := testenv.Get(t)
	ctx := t.Context()
	s, errs := compileAPI(t, appAPI)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	crd := map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "apps.schema.syncloop.dev"},
		"spec": map[string]any{
			"group": "schema.syncloop.dev", "scope": "Namespaced",
			"names": map[string]any{"kind": "App", "plural": "apps", "singular": "app", "listKind": "AppList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object",
					"properties": map[string]any{"spec": s, "status": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}},
		},
	}
	dc := serveCRD(t, env, crd, "schema.syncloop.dev/v1")
	apps := dc.Resource(schema.GroupVersionResource{Group: "schema.syncloop.dev", Version: "v1", Resource: "apps"}).Namespace("default")
	app := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "schema.syncloop.dev/v1", "kind": "App",
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	made, err := apps.Create(ctx, app("web", map[string]any{"image": "nginx", "name": "web", "limits": map[string]any{}}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path []string
		want any
	}{{[]string{"replicas"}, int64(1)}, {[]string{"port"}, int64(8080)}, {[]string{"tier"}, "bronze"}, {[]string{"limits", "cpu"}, "500m"}} {
		if got, _, _ := unstructured.NestedFieldNoCopy(made.Object, append([]string{"spec"}, f.path...)...); got != f.want {
			t.Errorf("spec.%s = %v (%T), want the default %v", strings.Join(f.path, "."), got, got, f.want)
		}
	}
	for _, bad := range []struct {
		name string
		spec map[string]any
		want string
	}{
		{"no-image", map[string]any{}, "spec.image: Required value"},
		{"bad-tier", map[string]any{"image": "x", "tier": "platinum"}, "spec.tier: Unsupported value"},
		{"too-many", map[string]any{"image": "x", "replicas": int64(51)}, "spec.replicas: Invalid value"},
		{"bad-name", map[string]any{"image": "x", "name": "Web"}, "spec.name: Invalid value"},
	} {
		_, err := apps.Create(ctx, app(bad.name, bad.spec), metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: created with %v, want refused with %q", bad.name, err, bad.want)
		}
	}
	made.Object["spec"].(map[string]any)["name"] = "other"
	if _, err := apps.Update(ctx, made, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "is immutable") {
		t.Errorf("changing an immutable field: %v, want refused", err)
	}
}

// serveCRD installs crd on env's API server until the test ends — the
// control plane is shared: the other tests list what it serves — and
// returns a client; gv is the group-version it serves.
func serveCRD(t *testing.T, env *testenv.Env, crd map[string]any, gv string) dynamic.Interface {
	t.Helper()
	data, err := sigsyaml.Marshal(crd)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "crd.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	name := crd["metadata"].(map[string]any)["name"].(string)
	t.Cleanup(func() { removeCRD(t, env, dc, name, gv) })
	if _, err := env.InstallCRDs(t.Context(), file); err != nil {
		t.Fatalf("the API server refused the CRD: %v", err)
	}
	return dc
}

// removeCRD deletes CRD name and waits until its group version gv is no
// longer served.
func removeCRD(t *testing.T, env *testenv.Env, dc dynamic.Interface, name, gv string) {
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if err := crds.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting CRD %s: %v", name, err)
		return
	}
	disco, err := discovery.NewDiscoveryClientForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, err := disco.ServerResourcesForGroupVersion(gv)
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("CRD %s still served 30s after its delete", name)
	}
}
