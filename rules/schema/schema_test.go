package schema

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"sigs.k8s.io/yaml"
)

func parse(t *testing.T, doc string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
		t.Fatal(err)
	}
	return normalize(v).(map[string]any)
}

// normalize turns sigs.k8s.io/yaml's float64 numbers into int64 where
// integral, as the rules decoder gives them.
func normalize(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = normalize(e)
		}
	case []any:
		for i, e := range v {
			v[i] = normalize(e)
		}
	case float64:
		if v == float64(int64(v)) {
			return int64(v)
		}
	}
	return v
}

func messages(ps []Problem) string {
	var out []string
	for _, p := range ps {
		out = append(out, pathString(p.Path)+": "+p.Msg)
	}
	return strings.Join(out, "\n")
}

func pathString(p []any) string {
	var b strings.Builder
	for _, e := range p {
		switch e := e.(type) {
		case int:
			b.WriteString("[" + string(rune('0'+e)) + "]")
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e)
		}
	}
	return b.String()
}

func TestBuiltinSchemas(t *testing.T) {
	for _, gvk := range []schema.GroupVersionKind{
		{Version: "v1", Kind: "ConfigMap"}, {Group: "apps", Version: "v1", Kind: "Deployment"},
		{Group: "networking.k8s.io", Version: "v1", Kind: "NetworkPolicy"}, {Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "RoleBinding"},
		{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"},
	} {
		s := Builtin().Schema(gvk)
		if s == nil || s.Properties["metadata"].Properties["labels"].AdditionalProperties == nil {
			t.Errorf("%s: no schema, or no metadata.labels in it", gvk)
		}
	}
	if Builtin().Schema(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "App"}) != nil {
		t.Error("a schema for a kind that is not built in")
	}
}

func TestCheck(t *testing.T) {
	deploy := Builtin().Schema(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"})
	cm := Builtin().Schema(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"})
	svc := Builtin().Schema(schema.GroupVersionKind{Version: "v1", Kind: "Service"})
	kindOf := func(_ []any, s string) Kind {
		if strings.HasPrefix(s, "${") && strings.HasSuffix(s, "}") && strings.Count(s, "${") == 1 {
			return Unknown
		}
		return String
	}
	tests := []struct {
		name string
		s    *spec.Schema
		doc  string
		want string
	}{
		{"well typed", deploy, `
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {a: b}, annotations: {"${variables.k}": v}}
spec:
  replicas: ${variables.replicas}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: app
          image: nginx
          ports: [{containerPort: 8080, name: http}]
          resources: {limits: {cpu: 500m, memory: 1Gi}}
`, ""},
		{"unknown field", cm, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndatas: {a: b}\n", `datas: unknown field "datas"`},
		{"interpolated string for an integer", deploy, "spec: {replicas: \"${variables.n}x\"}\n", "spec.replicas: wants an integer, the template gives a string"},
		{"literal string for an integer", deploy, "spec: {replicas: three}\n", "spec.replicas: wants an integer, the template gives a string"},
		{"int-or-string takes both", svc, "spec: {ports: [{port: 80, targetPort: http}, {port: 81, targetPort: 8081}]}\n", ""},
		{"bool for a string", cm, "data: {a: true}\n", "data.a: wants a string, the template gives a bool"},
		{"mapping for a list", deploy, "spec: {template: {spec: {containers: {name: x}}}}\n", "spec.template.spec.containers: wants an array (a list), the template gives a mapping"},
		{"deep unknown field", deploy, "spec: {template: {spec: {containers: [{name: x, imagePullPolicyy: Always}]}}}\n", `spec.template.spec.containers[0].imagePullPolicyy: unknown field "imagePullPolicyy"`},
		{"null removes", deploy, "spec: {replicas: null}\n", ""},
		{"int-or-string takes neither a list", svc, "spec: {ports: [{port: 80, targetPort: [http]}]}\n", "spec.ports[0].targetPort: wants an integer or a string, the template gives a list"},
		{"a quantity is a string or a number", deploy, "spec: {template: {spec: {containers: [{name: a, resources: {limits: {cpu: 1, memory: 1Gi, x: 0.5}, requests: {cpu: true}}}]}}}\n",
			"spec.template.spec.containers[0].resources.requests.cpu: wants a string or a number, the template gives a bool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := messages(Check(tt.s, parse(t, tt.doc), kindOf, false)); got != tt.want {
				t.Errorf("problems:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestCheckRequired(t *testing.T) {
	deploy := Builtin().Schema(schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"})
	doc := parse(t, "spec: {template: {spec: {containers: [{image: nginx}]}}}\n")
	ps := Check(deploy, doc, nil, true)
	if got := messages(ps); got != `spec: missing required field "selector" (unless defaulting or admission sets it)`+"\n"+
		`spec.template.spec.containers[0]: missing required field "name" (unless defaulting or admission sets it)` {
		t.Errorf("problems:\n%s", got)
	}
	for _, p := range ps {
		if !p.Warning {
			t.Errorf("%s: a missing required field must be a warning", p.Msg)
		}
	}
	if ps := Check(deploy, doc, nil, false); len(ps) != 0 {
		t.Errorf("without required: %s", messages(ps))
	}
}

// TestServed: kinds the snapshot does not know come from the server's
// document for their group-version, fetched once; a failed fetch counts as
// none served until Forget.
func TestServed(t *testing.T) {
	doc := `{"components": {"schemas": {
  "w": {"type": "object", "x-kubernetes-group-version-kind": [{"group": "g.io", "version": "v1", "kind": "W"}],
        "properties": {"spec": {"$ref": "#/components/schemas/s"}}},
  "s": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}`
	var fetched []string
	fail := true
	s := NewServed(func(gv schema.GroupVersion) ([]byte, string, error) {
		fetched = append(fetched, gv.String())
		if fail {
			return nil, "", errors.New("unreachable")
		}
		return []byte(doc), "tag1", nil
	}, Builtin())
	w := schema.GroupVersionKind{Group: "g.io", Version: "v1", Kind: "W"}
	if s.Schema(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}) == nil || len(fetched) != 0 {
		t.Fatalf("a built-in kind was fetched (%v) or not found", fetched)
	}
	if first, again := s.Schema(w), s.Schema(w); first != nil || again != nil || len(fetched) != 1 {
		t.Fatalf("failed fetch: fetched %v, want one fetch and no schema", fetched)
	}
	if !s.Missing("g.io") || !s.Stale("g.io", map[schema.GroupVersion]string{w.GroupVersion(): "tag1"}) {
		t.Error("a failed fetch is not missing, or not stale once the server serves the document")
	}
	fail = false
	s.Forget("g.io")
	got := s.Schema(w)
	if got == nil || got.Properties["spec"].Properties["n"].Type[0] != "integer" || len(fetched) != 2 {
		t.Fatalf("after Forget: schema %v, fetched %v", got, fetched)
	}
	if s.Version(w) == "" || s.Version(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}) != "" {
		t.Error("a served kind has no version, or a built-in one has")
	}
	if s.Missing("g.io") || s.Stale("g.io", map[schema.GroupVersion]string{w.GroupVersion(): "tag1"}) {
		t.Error("the document read is missing or stale")
	}
}
