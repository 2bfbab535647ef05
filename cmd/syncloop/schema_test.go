package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"sigs.k8s.io/yaml"
)

const schemaFile = "../../docs/syncloop.schema.json"

// TestSchemaCommitted: docs/syncloop.schema.json is what `syncloop schema`
// prints (go run ./cmd/syncloop schema > docs/syncloop.schema.json).
func TestSchemaCommitted(t *testing.T) {
	code, out, errOut := syncloop(t, "schema")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	committed, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(committed) {
		t.Error("docs/syncloop.schema.json is stale: go run ./cmd/syncloop schema > docs/syncloop.schema.json")
	}
}

// TestSchemaValidatesExamples: a JSON Schema validator accepts every Rule
// and Test document of the examples and rejects misspelt fields, as
// syncloop's decoder does.
func TestSchemaValidatesExamples(t *testing.T) {
	f, err := os.Open(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("syncloop.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("syncloop.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	validate := func(y string) error {
		t.Helper()
		j, err := yaml.YAMLToJSON([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(j))
		if err != nil {
			t.Fatal(err)
		}
		return sch.Validate(v)
	}
	files, _ := filepath.Glob(filepath.Join(examplesDir, "*", "*.yaml"))
	checked := map[string]int{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range strings.Split(string(data), "\n---\n") {
			if !strings.Contains(d, "apiVersion: syncloop.dev/v1alpha1") {
				continue
			}
			kind := "Rule"
			if strings.Contains(d, "\nkind: Test") {
				kind = "Test"
			}
			checked[kind]++
			if err := validate(d); err != nil {
				t.Errorf("%s: a %s the schema rejects: %v", file, kind, err)
			}
		}
	}
	if checked["Rule"] < 9 || checked["Test"] < 9 {
		t.Errorf("checked %v, want every example's rules and tests", checked)
	}

	rule := "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  watch: {apiVersion: v1, kind: Namespace}\n  status: {a: b}\n"
	if err := validate(rule); err != nil {
		t.Fatalf("a valid rule: %v", err)
	}
	for _, bad := range []struct{ name, doc, want string }{
		{"misspelt spec field", strings.Replace(rule, "status:", "statuss:", 1), "statuss"},
		{"misspelt watch field", strings.Replace(rule, "kind: Namespace}", "kind: Namespace, labelSelectr: x}", 1), "labelSelectr"},
		{"wrong type", strings.Replace(rule, "status: {a: b}", "workers: many", 1), "workers"},
		{"misspelt test field", "apiVersion: syncloop.dev/v1alpha1\nkind: Test\nmetadata: {name: t}\nrules: [r.yaml]\nobjects: [o.yaml]\nexpect: [{rule: r, trigger: {kind: Namespace, name: a}, childern: []}]\n", "childern"},
	} {
		if err := validate(bad.doc); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: error = %v, want one naming %q", bad.name, err, bad.want)
		}
	}
}
