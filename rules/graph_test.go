package rules

import (
	"strings"
	"testing"
)

// chainRule: cm reads svc's allocated address and waits for it; status
// reads readiness. Resource order in the file is not dependency order.
const chainRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: chain}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-addr"}
        data:
          address: "${children.svc.spec.clusterIP}:80"
          literal: "children.db is not a reference"
    - id: svc
      readyWhen:
        - self.spec.?clusterIP.orValue('') != ''
      template:
        apiVersion: v1
        kind: Service
        metadata: {name: "${object.metadata.name}"}
        spec: {ports: [{port: 80}]}
    - id: db
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-db"}
  status:
    address: "${children.?cm.?data.?address.orValue('')}"
    svcReady: ${ready.svc}
`

func TestGraphEdgesAndOrder(t *testing.T) {
	r := parseRule(t, chainRule)
	var order []string
	for _, res := range r.Order {
		order = append(order, res.ID)
	}
	if got := strings.Join(order, " "); got != "svc cm db" {
		t.Errorf("order %q, want %q (svc before cm, which reads it; the rest in spec order)", got, "svc cm db")
	}
	cm := r.Resources[0]
	if len(cm.Deps) != 1 || cm.Deps[0].ID != "svc" {
		t.Errorf("cm deps %v, want svc only (a string literal is not a reference)", cm.Deps)
	}
	if len(r.Resources[1].Dependents) != 1 || len(r.Resources[2].Deps) != 0 {
		t.Errorf("svc dependents %v, db deps %v", r.Resources[1].Dependents, r.Resources[2].Deps)
	}
	if got := cm.Refs[0].Pos.String(); got != "rule.yaml:13:23" {
		t.Errorf("reference placed at %s, want rule.yaml:13:23", got)
	}
}

func TestGraphLoadErrors(t *testing.T) {
	res := func(id, body string) string {
		return "    - id: " + id + "\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: " + id + "}\n" + body
	}
	tests := []struct{ name, yaml, want string }{
		{"unknown id", head + watchNS + "  resources:\n" + res("a", "        data: {x: \"${children.b.metadata.name}\"}\n"),
			`r.yaml:15:31: rule "r": spec.resources[0].template.data.x: ${children.b.metadata.name}: undeclared resource id "b" (declared: a)`},
		{"cycle", head + watchNS + "  resources:\n" +
			res("a", "        data: {x: \"${children.b.metadata.name}\"}\n") +
			res("b", "        data: {x: \"${children.c.metadata.name}\"}\n") +
			res("c", "      \n        data: {x: \"${children.a.metadata.name}\"}\n"),
			`r.yaml:15:22: rule "r": spec.resources[0]: dependency cycle: "a" reads children.b at r.yaml:15:22, "b" reads children.c at r.yaml:21:22, "c" reads children.a at r.yaml:28:22`},
		{"self", head + watchNS + "  resources:\n    - id: a\n      when: has(children.a.data)\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
			`r.yaml:11:17: rule "r": spec.resources[0]: dependency cycle: resource "a" reads its own children (children.a at r.yaml:11:17)`},
		{"children passed whole", head + watchNS + "  resources:\n" + res("a", "") + res("b", "        data: {x: \"${string(size(children))}\"}\n"),
			`r.yaml:20:34: rule "r": spec.resources[1].template.data.x: ${string(size(children))}: children must be followed by a resource id`},
		{"readyWhen not bool", head + watchNS + "  resources:\n    - id: a\n      readyWhen: [\"'yes'\"]\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
			`r.yaml:11:19: rule "r": spec.resources[0].readyWhen[0]: must produce a bool, but produces string`},
		{"readyWhen sees only self", head + watchNS + "  resources:\n    - id: a\n      readyWhen: [object.metadata.name == 'a']\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
			`r.yaml:11:19: rule "r": spec.resources[0].readyWhen[0]: undeclared reference to 'object'`},
		{"bad deletionPolicy", head + watchNS + "  resources:\n    - id: a\n      deletionPolicy: Keep\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
			`r.yaml:11:23: rule "r": spec.resources[0].deletionPolicy: must be Delete or Orphan, not "Keep"`},
		{"optional typo", head + watchNS + "  resources:\n" + res("a", "") + "  status:\n    x: ${children.?b.orValue(null)}\n",
			`r.yaml:16:20: rule "r": spec.status.x: ${children.?b.orValue(null)}: undeclared resource id "b" (declared: a)`},
		{"ready typo", head + watchNS + "  resources:\n" + res("a", "") + "  status:\n    x: ${ready.b}\n",
			`r.yaml:16:16: rule "r": spec.status.x: ${ready.b}: undeclared resource id "b" (declared: a)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantLoadError(t, tt.yaml, tt.want) })
	}
}
