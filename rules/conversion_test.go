package rules

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	sigsyaml "sigs.k8s.io/yaml"
)

// loadVersions loads testdata/api/versions.yaml: App in v1 (stored) and
// v1alpha1.
func loadVersions(t *testing.T) *Rule {
	t.Helper()
	set, err := newLoader(t).Load(filepath.Join("testdata", "api", "versions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return set.Get("app")
}

func object(t *testing.T, doc string) map[string]any {
	t.Helper()
	var obj map[string]any
	if err := sigsyaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

// TestVersionsCRD: a kind of two versions is one CRD of both, v1 stored,
// v1alpha1 deprecated with its warning, converted by syncloop's webhook:
// the golden file's.
func TestVersionsCRD(t *testing.T) {
	r := loadVersions(t)
	if r.Watch.GVK.Version != "v1" || r.API.Version.Name != "v1" || r.API.StorageVersion().Name != "v1" || !r.API.Converts() {
		t.Fatalf("watch %v, read %s, stored %s", r.Watch.GVK, r.API.Version.Name, r.API.StorageVersion().Name)
	}
	got, err := sigsyaml.Marshal(r.CRD().Object)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, filepath.Join("testdata", "api", "versions.crd.golden.yaml"), "CRD", got)
}

// TestConvert: each direction renders its template, copies what both
// versions hold alike, and keeps metadata and status.
func TestConvert(t *testing.T) {
	a := loadVersions(t).API
	old := object(t, `
apiVersion: example.syncloop.dev/v1alpha1
kind: App
metadata: {name: web, namespace: shop, uid: u1, labels: {team: a}}
spec: {size: 3, image: "nginx:1.29", probe: {path: /ready}}
status: {conditions: [{type: Ready, status: "True"}]}
`)
	got, err := a.Convert(context.Background(), old, "v1")
	if err != nil {
		t.Fatal(err)
	}
	want := object(t, `
apiVersion: example.syncloop.dev/v1
kind: App
metadata: {name: web, namespace: shop, uid: u1, labels: {team: a}}
spec: {replicas: 3, image: nginx, tag: "1.29", probe: {path: /ready}}
status: {conditions: [{type: Ready, status: "True"}]}
`)
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("v1alpha1 → v1:\n%s\nwant\n%s", js(got), js(want))
	}
	if old["apiVersion"] != "example.syncloop.dev/v1alpha1" {
		t.Error("Convert changed the object it was given")
	}
	back, err := a.Convert(context.Background(), got, "v1alpha1")
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(back, old) {
		t.Errorf("v1alpha1 → v1 → v1alpha1:\n%s\nwant\n%s", js(back), js(old))
	}
	if _, err := a.Convert(context.Background(), old, "v2"); err == nil || !strings.Contains(err.Error(), "has no version v2") {
		t.Errorf("to an unknown version: %v", err)
	}
}

// TestConvertRoundTrip: a field only v1 has (ports) survives a trip
// through v1alpha1 in an annotation — and an update there by a client
// that knows only v1alpha1 — and the annotation is gone once back.
func TestConvertRoundTrip(t *testing.T) {
	a := loadVersions(t).API
	ctx := context.Background()
	v1 := object(t, `
apiVersion: example.syncloop.dev/v1
kind: App
metadata: {name: web, namespace: shop}
spec: {replicas: 2, image: nginx, tag: "1.29", ports: [80, 443], probe: {path: /healthz}}
`)
	alpha, err := a.Convert(ctx, v1, "v1alpha1")
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := alpha["metadata"].(map[string]any)["annotations"].(map[string]any)[AnnotationConversionPrefix+"v1"].(string)
	if kept != `{"spec":{"ports":[80,443]}}` {
		t.Errorf("annotation %q, want the ports v1alpha1 cannot hold", kept)
	}
	if _, ok := alpha["spec"].(map[string]any)["ports"]; ok {
		t.Error("v1alpha1 got ports, which it does not have")
	}
	alpha["spec"].(map[string]any)["size"] = int64(5) // a v1alpha1 client scales it
	back, err := a.Convert(ctx, alpha, "v1")
	if err != nil {
		t.Fatal(err)
	}
	want := runtimeCopy(v1)
	want["spec"].(map[string]any)["replicas"] = int64(5)
	if !equality.Semantic.DeepEqual(back, want) {
		t.Errorf("v1 → v1alpha1 (scaled) → v1:\n%s\nwant\n%s", js(back), js(want))
	}
}

func runtimeCopy(m map[string]any) map[string]any {
	var out map[string]any
	data, _ := json.Marshal(m)
	_ = json.Unmarshal(data, &out)
	return out
}

func js(v any) string {
	data, _ := json.MarshalIndent(v, "", "  ")
	return string(data)
}

// TestConversionErrors: every mistake in versions and conversions is a
// load error at its file:line:col, offline.
func TestConversionErrors(t *testing.T) {
	base, err := os.ReadFile(filepath.Join("testdata", "api", "versions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, from, to, want string }{
		{"required field produced by nothing", "            replicas: ${object.spec.size}\n", "",
			`r.yaml:35:11: rule "app": spec.api.versions[1].toHub.spec: spec.replicas is required in v1 and nothing produces it from v1alpha1`},
		{"field neither produced nor lossy", "          lossy: [spec.ports]\n", "",
			`r.yaml:35:11: rule "app": spec.api.versions[1].toHub.spec: spec.ports of v1 is produced by nothing from v1alpha1 (no field of the same name and type): write it in spec.api.versions[1].toHub.spec, or list it in spec.api.versions[1].toHub.lossy`},
		{"lossy names no field", "lossy: [spec.ports]", "lossy: [spec.port]",
			`r.yaml:39:19: rule "app": spec.api.versions[1].toHub.lossy[0]: v1 has no field spec.port`},
		{"unknown field written", "            size: ${object.spec.replicas}\n", "            size: ${object.spec.replicas}\n            sizes: 1\n",
			`r.yaml:43:13: rule "app": spec.api.versions[1].fromHub.spec.sizes: unknown field "sizes": App v1alpha1's spec has no such field (did you mean "size"?)`},
		{"wrong type written", "replicas: ${object.spec.size}", "replicas: ${string(object.spec.size)}",
			`r.yaml:36:23: rule "app": spec.api.versions[1].toHub.spec.replicas:`},
		{"field of the other version read", "size: ${object.spec.replicas}", "size: ${object.spec.size}",
			`r.yaml:42:33: rule "app": spec.api.versions[1].fromHub.spec.size: ${object.spec.size}: example.syncloop.dev/v1.App.spec has no field "size"`},
		{"two storage versions", "        deprecated: true\n", "        deprecated: true\n        storage: true\n",
			`rule "app": spec.api.versions: versions v1, v1alpha1 are all marked storage`},
		{"no storage version", "        storage: true\n", "",
			`rule "app": spec.api.versions: no version is the storage version`},
		{"read version not listed", "example.syncloop.dev/v1\n", "example.syncloop.dev/v2\n",
			`r.yaml:10:17: rule "app": spec.api.apiVersion: version v2 is not among spec.api.versions (v1, v1alpha1)`},
		{"spec beside versions", "    kind: App\n", "    kind: App\n    spec: {a: string}\n",
			`rule "app": spec.api.spec: with spec.api.versions, each version has its own spec`},
		{"conversion on the hub", "        storage: true\n", "        storage: true\n        toHub: {}\n",
			`rule "app": spec.api.versions[0].toHub: v1 is the hub, being the storage version and no version marked hub: true`},
		{"storage moved, hub not kept", "        storage: true\n", "",
			`spec.api.versions[1].toHub: v1alpha1 is the hub, being the storage version and no version marked hub: true: the other versions convert to and from it (moving the storage version to v1alpha1? mark the version these conversions go to and from hub: true`},
		{"two hubs", "        storage: true\n", "        storage: true\n        hub: true\n",
			`spec.api.versions: versions v1, v1alpha1 are all marked hub`},
		{"version twice", "      - name: v1alpha1\n", "      - name: v1\n",
			`rule "app": spec.api.versions[1].name: version v1 is listed twice`},
		{"warning without deprecated", "        deprecated: true\n", "",
			`spec.api.versions[1].deprecationWarning: only a deprecated version warns`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := strings.Replace(string(base), tt.from, tt.to, 1)
			switch tt.name {
			case "storage moved, hub not kept":
				doc = strings.Replace(doc, "        deprecated: true\n", "        deprecated: true\n        storage: true\n", 1)
			case "two hubs":
				doc = strings.Replace(doc, "        deprecated: true\n", "        deprecated: true\n        hub: true\n", 1)
			}
			if tt.name == "required field produced by nothing" {
				doc = strings.Replace(doc, "replicas: integer | default=1", "replicas: integer | required=true", 1)
			}
			if doc == string(base) {
				t.Fatal("the change did not apply")
			}
			_, err := newLoader(t).Parse("r.yaml", []byte(doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant one with\n%s", err, tt.want)
			}
		})
	}
}

// TestConversionOf: the CRD of a kind that converts carries its spec.api,
// from which the same conversions compile without the rule.
func TestConversionOf(t *testing.T) {
	r := loadVersions(t)
	crd := r.CRD()
	a, err := ConversionOf(crd.GetName(), []byte(crd.GetAnnotations()[AnnotationConversion]))
	if err != nil {
		t.Fatal(err)
	}
	old := object(t, `{apiVersion: example.syncloop.dev/v1alpha1, kind: App, metadata: {name: web}, spec: {size: 3, image: "nginx:1.29"}}`)
	want, err := r.API.Convert(context.Background(), old, "v1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := a.Convert(context.Background(), old, "v1")
	if err != nil || !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("from the annotation: %s, %v; from the rule: %s", js(got), err, js(want))
	}
	if _, err := ConversionOf("x", []byte(`{"apiVersion": "example.syncloop.dev/v1", "kind": "App", "versions": [{"name": "v1"}]}`)); err == nil || !strings.Contains(err.Error(), "spec.api.versions[0].spec: required") {
		t.Errorf("a broken annotation: %v", err)
	}
}

// TestStorageMovesHubStays: the storage version moves to v1alpha1 while
// v1 stays the hub (hub: true): the conversions, written to and from v1,
// stay as they are and convert the same.
func TestStorageMovesHubStays(t *testing.T) {
	base, err := os.ReadFile(filepath.Join("testdata", "api", "versions.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(base), "        storage: true\n", "        hub: true\n", 1)
	doc = strings.Replace(doc, "        deprecated: true\n", "        deprecated: true\n        storage: true\n", 1)
	f, err := newLoader(t).Parse("r.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	a := f.Rules[0].API
	if a.StorageVersion().Name != "v1alpha1" || a.Hub().Name != "v1" {
		t.Fatalf("stored in %s, hub %s", a.StorageVersion().Name, a.Hub().Name)
	}
	old := object(t, `{apiVersion: example.syncloop.dev/v1alpha1, kind: App, metadata: {name: web}, spec: {size: 3, image: "nginx:1.29"}}`)
	got, err := a.Convert(context.Background(), old, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if spec := got["spec"].(map[string]any); fmt.Sprint(spec["replicas"]) != "3" || spec["tag"] != "1.29" {
		t.Errorf("v1alpha1 → v1 with v1 the hub, not stored: %s", js(got))
	}
}
