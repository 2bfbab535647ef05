package rules

import (
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/syncloop/syncloop/internal/testenv"
)

// TestKroWebApplication: kro's documented WebApplication schema, pasted
// unchanged into spec.api, loads; its CRD is served; a minimal instance
// is defaulted by the API server — a nested object whose fields all have
// defaults included — exactly as syncloop defaults it offline (render,
// test); required fields, the map's named type and immutability are
// enforced.
func TestKroWebApplication(t *testing.T) {
	set, err := newLoader(t).Load(filepath.Join("testdata", "api", "webapp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := set.Get("webapp")
	if got := strings.Join(r.API.Version.Spec.Required, ","); got != "name,image,values" {
		t.Errorf("required %s, want name,image,values", got)
	}
	if testing.Short() {
		return
	}
	env := testenv.Get(t)
	ctx := t.Context()
	dc := serveCRD(t, env, r.CRD().Object, "kro.example.com/v1alpha1")
	apps := dc.Resource(schema.GroupVersionResource{Group: "kro.example.com", Version: "v1alpha1", Resource: "webapplications"}).Namespace("default")
	app := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kro.example.com/v1alpha1", "kind": "WebApplication",
			"metadata": map[string]any{"name": name, "namespace": "default"}, "spec": spec}}
	}
	minimal := app("web", map[string]any{"name": "web", "image": "nginx", "values": map[string]any{"any": []any{"thing"}},
		"env": map[string]any{"LOG": map[string]any{"value1": "debug"}}})
	made, err := apps.Create(ctx, minimal, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	served := made.Object["spec"].(map[string]any)
	want := `{"env":{"LOG":{"value1":"debug","value2":42}},"image":"nginx","ingress":{"enabled":false,"host":"example.com","path":"/"},"name":"web","replicas":1,"values":{"any":["thing"]}}`
	if got := jsonOf(served); got != want {
		t.Errorf("the API server defaulted the spec to\n%s\nwant\n%s", got, want)
	}
	if offline := jsonOf(set.Default([]*unstructured.Unstructured{minimal})[0].Object["spec"]); offline != jsonOf(served) {
		t.Errorf("syncloop defaults the spec offline to\n%s\nthe API server to\n%s", offline, jsonOf(served))
	}
	refused(t, apps, app("no-values", map[string]any{"name": "x", "image": "x"}), "spec.values: Required value")
	refused(t, apps, app("env-without-value1", map[string]any{"name": "x", "image": "x", "values": map[string]any{},
		"env": map[string]any{"A": map[string]any{"value2": int64(1)}}}), "spec.env.A.value1: Required value")
	refused(t, apps, app("no-replicas", map[string]any{"name": "x", "image": "x", "values": map[string]any{}, "replicas": int64(0)}),
		"spec.replicas: Invalid value")
	made.Object["spec"].(map[string]any)["name"] = "other"
	if _, err := apps.Update(ctx, made, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "is immutable") {
		t.Errorf("changing spec.name: %v, want refused as immutable", err)
	}
}

// refused creates obj and fails unless the API server refuses it as
// invalid with a message holding want.
func refused(t *testing.T, c dynamic.ResourceInterface, obj *unstructured.Unstructured, want string) {
	t.Helper()
	if _, err := c.Create(t.Context(), obj, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: created with %v, want refused with %q", obj.GetName(), err, want)
	}
}

// markersAPI uses kro's markers for lists, validations and required
// named types.
const markersAPI = `spec:
  tags: '[]string | uniqueItems=true minItems=1 maxItems=3'
  containers: '[]Container | listType=map listMapKey=name'
  retry:
    attempts: integer | default=3
    backoff: Backoff
  port: Port
  check: 'string | validation="self.startsWith(''a'')"'
types:
  Container:
    name: string | required=true
    port: Port
  Backoff:
    seconds: integer | default=10
  Port: integer | required=true minimum=1
`

// TestAPIMarkersServed: kro's list markers, validation marker and
// required named types compile to a CRD the API server takes and
// enforces as kro's do: a set refuses duplicates, item counts are
// bounded, a keyed list refuses two items with one key, a field of a
// required named type is required, and nested objects default.
func TestAPIMarkersServed(t *testing.T) {
	s, errs := compileAPI(t, markersAPI)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := strings.Join(s.Required, ","); got != "port" {
		t.Errorf("required %s, want port (a field of a required named type)", got)
	}
	if tags := s.Properties["tags"]; tags.Extensions["x-kubernetes-list-type"] != "set" || *tags.MinItems != 1 || *tags.MaxItems != 3 {
		t.Errorf("tags: %+v", tags)
	}
	if got := jsonOf(s.Properties["retry"].Default); got != `{"attempts":3,"backoff":{"seconds":10}}` {
		t.Errorf("retry's default %s", got)
	}
	if testing.Short() {
		return
	}
	env := testenv.Get(t)
	crd := map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "markers.markers.syncloop.dev"},
		"spec": map[string]any{
			"group": "markers.syncloop.dev", "scope": "Namespaced",
			"names": map[string]any{"kind": "Marker", "plural": "markers", "singular": "marker", "listKind": "MarkerList"},
			"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object",
					"properties": map[string]any{"spec": jsonValue(t, s)}}}}},
		},
	}
	dc := serveCRD(t, env, crd, "markers.syncloop.dev/v1")
	c := dc.Resource(schema.GroupVersionResource{Group: "markers.syncloop.dev", Version: "v1", Resource: "markers"}).Namespace("default")
	obj := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "markers.syncloop.dev/v1", "kind": "Marker",
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	made, err := c.Create(t.Context(), obj("ok", map[string]any{"port": int64(80), "tags": []any{"a", "b"}, "check": "abc",
		"containers": []any{map[string]any{"name": "app", "port": int64(8080)}, map[string]any{"name": "sidecar", "port": int64(9090)}}}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := jsonOf(made.Object["spec"].(map[string]any)["retry"]); got != `{"attempts":3,"backoff":{"seconds":10}}` {
		t.Errorf("retry defaulted to %s by the API server", got)
	}
	container := func(name string, port int64) map[string]any { return map[string]any{"name": name, "port": port} }
	for _, bad := range []struct {
		name string
		spec map[string]any
		want string
	}{
		{"duplicate-tags", map[string]any{"port": int64(80), "tags": []any{"a", "a"}}, "spec.tags[1]: Duplicate value"},
		{"too-many-tags", map[string]any{"port": int64(80), "tags": []any{"a", "b", "c", "d"}}, "spec.tags: Too many"},
		{"no-tags", map[string]any{"port": int64(80), "tags": []any{}}, "spec.tags: Invalid value"},
		{"duplicate-container", map[string]any{"port": int64(80), "containers": []any{container("a", 1), container("a", 2)}}, "spec.containers[1]: Duplicate value"},
		{"container-without-port", map[string]any{"port": int64(80), "containers": []any{map[string]any{"name": "a"}}}, "spec.containers[0].port: Required value"},
		{"no-port", map[string]any{}, "spec.port: Required value"},
		{"check", map[string]any{"port": int64(80), "check": "b"}, "failed rule: self.startsWith('a')"},
	} {
		refused(t, c, obj(bad.name, bad.spec), bad.want)
	}
}
