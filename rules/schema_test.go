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

// TestExpressionTypes: expressions are typed by the schemas of the kinds
// they read — built in, or a CRD in the same file.
func TestExpressionTypes(t *testing.T) {
	widget := widgetCRD + head + "  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget}\n"
	tests := []struct{ name, yaml, want string }{
		{"misspelt field of a CRD trigger", widget + "  when: object.spec.szie > 1\n" + cm,
			`r.yaml:33:21: rule "r": spec.when: test.syncloop.dev/v1.Widget.spec has no field "szie" (did you mean "size"?)`},
		{"a CRD's integer is not a string", widget + "  when: object.spec.size == 'big'\n" + cm,
			`r.yaml:33:26: rule "r": spec.when: found no matching overload for '_==_' applied to '(int, string)'`},
		{"preserve-unknown-fields is dyn; the status is checked by the CRD", widget +
			"  when: object.spec.extra.anything.deep == 'x' && object.spec.size > 1\n" +
			"  status:\n    ready: \"${object.spec.extra.flag}\"\n", ""},
		{"well typed over Deployments", head + watchDeploy + `  when: object.spec.replicas > 0 && object.metadata.creationTimestamp < timestamp('2030-01-01T00:00:00Z')
  resources:
    - id: images
      forEach: object.spec.template.spec.containers.filter(c, c.image != '')
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${item.name}", namespace: "${object.metadata.namespace}"}
        data: {image: "${item.image}", port: "${string(item.?ports[0].containerPort.orValue(0))}"}
    - id: copy
      readyWhen: [self.status.readyReplicas == self.spec.replicas]
      template:
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: "${object.metadata.name}-copy", namespace: "${object.metadata.namespace}"}
        spec:
          replicas: ${object.spec.replicas}
          selector: "${object.spec.selector}"
          template: "${object.spec.template}"
`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantLoadError(t, tt.yaml, tt.want) })
	}
}
