package rules

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// widgetCRD defines test.syncloop.dev/v1 Widget: spec.size an integer,
// spec.extra anything, status.ready a bool.
const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.test.syncloop.dev}
spec:
  group: test.syncloop.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer}
                extra: {type: object, x-kubernetes-preserve-unknown-fields: true}
                inner: {type: object, x-kubernetes-embedded-resource: true, properties: {spec: {type: object, properties: {n: {type: integer}}}}}
            status:
              type: object
              properties:
                ready: {type: boolean}
---
`

// TestTemplateSchemaErrors: templates are checked against the schema of
// their kind — built in, or a CRD in the same file — when the rule loads.
func TestTemplateSchemaErrors(t *testing.T) {
	res := func(tmpl string) string {
		return head + watchNS + "  resources:\n    - id: a\n      template:\n" + tmpl
	}
	tests := []struct{ name, yaml, want string }{
		{"unknown field", res("        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: a, namespace: x}\n        datas: {k: v}\n"),
			`r.yaml:15:9: rule "r": spec.resources[0].template.datas: unknown field "datas": ConfigMap has no such field (did you mean "data"?)`},
		{"string for an integer", res("        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: a, namespace: x}\n        spec: {replicas: \"${object.metadata.name}-1\"}\n"),
			`r.yaml:15:26: rule "r": spec.resources[0].template.spec.replicas: wants an integer, the template gives a string`},
		{"typed expression", res("        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: a, namespace: x}\n        spec: {paused: \"${size(object.metadata.name)}\"}\n"),
			`r.yaml:15:24: rule "r": spec.resources[0].template.spec.paused: wants a bool, the template gives an integer`},
		{"deep unknown field", res("        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: a, namespace: x}\n        spec:\n          template:\n            spec:\n              containers:\n                - {name: a, image: b, imagePullPolicyy: Always}\n"),
			`r.yaml:19:39: rule "r": spec.resources[0].template.spec.template.spec.containers[0].imagePullPolicyy: unknown field "imagePullPolicyy": Deployment has no such field (did you mean "imagePullPolicy"?)`},
		{"a CRD in the same file", widgetCRD + res("        apiVersion: test.syncloop.dev/v1\n        kind: Widget\n        metadata: {name: a, namespace: x}\n        spec: {size: 3, szie: 4, extra: {any: [thing]}}\n"),
			`r.yaml:41:25: rule "r": spec.resources[0].template.spec.szie: unknown field "szie": Widget has no such field (did you mean "size"?)`},
		{"an embedded resource has apiVersion, kind and metadata", widgetCRD + res("        apiVersion: test.syncloop.dev/v1\n        kind: Widget\n        metadata: {name: a, namespace: x}\n        spec: {inner: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {n: x}}}\n"),
			`r.yaml:41:82: rule "r": spec.resources[0].template.spec.inner.spec.n: wants an integer, the template gives a string`},
		{"the trigger's status", widgetCRD + head + "  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget}\n  status:\n    ready: \"yes\"\n",
			`r.yaml:34:12: rule "r": spec.status.ready: wants a bool, the template gives a string`},
		{"well typed", res(`        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: a, namespace: x, labels: {app: a}}
        spec:
          replicas: "${object.metadata.?labels.?n.orValue('1') == '1' ? 1 : 2}"
          selector: {matchLabels: {app: a}}
          template:
            metadata: {labels: {app: a}}
            spec:
              containers:
                - name: a
                  image: nginx
                  ports: [{containerPort: 80, name: http}]
                  resources: {limits: {cpu: 1, memory: 1Gi}}
`), ""},
		{"a kind without a schema is not checked", res("        apiVersion: example.com/v1\n        kind: Thing\n        metadata: {name: a, namespace: x}\n        anything: {goes: 1}\n"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantLoadError(t, tt.yaml, tt.want) })
	}
}

// TestUseCRDs: CRDs given to the loader (render's --objects) check the
// templates of their kinds.
func TestUseCRDs(t *testing.T) {
	l := newLoader(t)
	objs, err := readObjectsFrom(t, widgetCRD)
	if err != nil {
		t.Fatal(err)
	}
	l.UseCRDs(objs)
	doc := head + watchNS + "  resources:\n    - id: a\n      template:\n        apiVersion: test.syncloop.dev/v1\n        kind: Widget\n        metadata: {name: a, namespace: x}\n        spec: {size: big}\n"
	if _, err := l.Parse("r.yaml", []byte(doc)); err == nil {
		t.Error("a string for the CRD's integer spec.size was accepted")
	}
}

func readObjectsFrom(t *testing.T, doc string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	path := t.TempDir() + "/objects.yaml"
	write(t, path, doc)
	return ReadObjects(path)
}
