package rules

import (
	"errors"
	"strings"
	"testing"

	"github.com/syncloop/syncloop/rules/expr"
)

func newLoader(t testing.TB) *Loader {
	t.Helper()
	l, err := NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// head is the first five lines of a rule document; spec's fields start on
// line 6, indented by two.
const head = "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n"

// watchNS is a valid watch (lines 6-8).
const watchNS = "  watch:\n    apiVersion: v1\n    kind: Namespace\n"

// watchDeploy watches Deployments (lines 6-8).
const watchDeploy = "  watch:\n    apiVersion: apps/v1\n    kind: Deployment\n"

// cm is a valid resource list (from its line on: 6 lines).
const cm = "  resources:\n    - id: cm\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: x, namespace: ns}\n"

func TestValidationErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want string // the complete error line, file "r.yaml"
	}{
		{"yaml syntax", "apiVersion: a\n  kind: b: c\n",
			`r.yaml:2: YAML: mapping values are not allowed in this context`},
		{"typo in when variable", head + watchNS + "  when: \"objet.metadata.name == 'a'\"\n" + cm,
			`r.yaml:9:10: rule "r": spec.when: undeclared reference to 'objet'`},
		{"when not bool", head + watchNS + "  when: object.metadata.name\n" + cm,
			`r.yaml:9:9: rule "r": spec.when: must produce a bool, but produces string`}, // typed by the Namespace schema
		{"when not bool, dyn", head + watchNS + "  when: dyn(object.metadata.name)\n" + cm,
			``}, // dyn: accepted at load, checked when evaluated (see TestRenderErrors)
		{"when a string literal", head + watchNS + "  when: \"'yes'\"\n" + cm,
			`r.yaml:9:9: rule "r": spec.when: must produce a bool, but produces string`},
		{"forEach not a list", head + watchNS + "  resources:\n    - id: cm\n      forEach: \"{'a': 1}\"\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: x}\n",
			`r.yaml:11:16: rule "r": spec.resources[0].forEach: must produce a list, but produces map(string, int)`},
		// Types: what expressions read is typed by the schemas of its kinds.
		{"misspelt trigger field", head + watchDeploy + "  when: object.spec.replicsa > 1\n" + cm,
			`r.yaml:9:21: rule "r": spec.when: apps/v1.Deployment.spec has no field "replicsa" (did you mean "replicas"?)`},
		{"forEach over a string", head + watchNS + "  resources:\n    - id: cm\n      forEach: object.metadata.name\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: x}\n",
			`r.yaml:11:16: rule "r": spec.resources[0].forEach: must produce a list, but produces string`},
		{"item field misspelt", head + watchDeploy + "  resources:\n    - id: cm\n      forEach: object.spec.template.spec.containers\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: \"${item.nmae}\"}\n",
			`r.yaml:15:34: rule "r": spec.resources[0].template.metadata.name: ${item.nmae}: apps/v1.Deployment.spec.template.spec.containers.@item has no field "nmae" (did you mean "name"?)`},
		{"child field misspelt", head + watchNS + cm + "    - id: copy\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: y}\n        data: {a: \"${children.cm.dat.a}\"}\n",
			`r.yaml:20:34: rule "r": spec.resources[1].template.data.a: ${children.cm.dat.a}: v1.ConfigMap has no field "dat" (did you mean "data"?)`},
		{"readyWhen on a misspelt status field", head + watchNS + "  resources:\n    - id: d\n      readyWhen: [self.status.readyReplica == 1]\n      template:\n        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: x}\n",
			`r.yaml:11:31: rule "r": spec.resources[0].readyWhen[0]: apps/v1.Deployment.status has no field "readyReplica" (did you mean "readyReplicas"?)`},
		{"mistyped template value from CEL", head + watchNS + "  resources:\n    - id: d\n      template:\n        apiVersion: apps/v1\n        kind: Deployment\n        metadata: {name: x}\n        spec: {replicas: \"${object.metadata.name}\"}\n",
			`r.yaml:15:26: rule "r": spec.resources[0].template.spec.replicas: wants an integer, the template gives a string`},
		{"bytes are not strings", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, namespace: x, name: y}\n" + "  variables:\n    - {name: t, expression: \"lookups.s.data.token.startsWith('a')\"}\n" + cm,
			`r.yaml:12:61: rule "r": spec.variables[0].expression: found no matching overload for 'startsWith' applied to 'bytes.(string)'`},
		{"item outside forEach", head + watchNS + "  resources:\n    - id: cm\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: \"x-${item}\"}\n",
			`r.yaml:14:31: rule "r": spec.resources[0].template.metadata.name: ${item}: undeclared reference to 'item'`},
		{"unknown variable", head + watchNS + "  variables:\n    - name: tier\n      expression: \"'gold'\"\n" + cm + "  status:\n    t: ${variables.tire}\n",
			`r.yaml:19:20: rule "r": spec.status.t: ${variables.tire}: undeclared variable "tire" (declared: tier)`},
		{"when uses a variable", head + watchNS + "  variables:\n    - name: tier\n      expression: \"'gold'\"\n  when: variables.tier == 'gold'\n" + cm,
			`r.yaml:12:19: rule "r": spec.when: undeclared variable "tier" (no variables are declared here)`},
		{"variable uses a later one", head + watchNS + "  variables:\n    - name: a\n      expression: variables.b\n    - name: b\n      expression: \"1\"\n" + cm,
			`r.yaml:11:29: rule "r": spec.variables[0].expression: undeclared variable "b" (no variables are declared here)`},
		{"unknown child in status", head + watchNS + cm + "  status:\n    ok: ${has(children.cn.metadata)}\n",
			`r.yaml:16:24: rule "r": spec.status.ok: ${has(children.cn.metadata)}: undeclared resource id "cn" (declared: cm)`},
		{"unknown field with suggestion", head + watchNS + "  wen: \"true\"\n" + cm,
			`r.yaml:9:3: rule "r": spec: unknown field "wen" (did you mean "when"?)`},
		{"unknown top-level field", "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspek: {}\n",
			`r.yaml:4:1: rule "r": unknown field "spek" (did you mean "spec"?)`},
		{"duplicate key", head + watchNS + "  workers: 1\n  workers: 2\n" + cm,
			`r.yaml:10:3: rule "r": spec.workers: key given twice`},
		{"wrong apiVersion", "apiVersion: syncloop.dev/v1\nkind: Rule\nmetadata: {name: r}\nspec: {}\n",
			`r.yaml:1:13: rule "r": apiVersion: must be syncloop.dev/v1alpha1, not "syncloop.dev/v1"`},
		{"wrong kind", "apiVersion: syncloop.dev/v1alpha1\nkind: Rules\nmetadata: {name: r}\nspec: {}\n",
			`r.yaml:2:7: rule "r": kind: must be Rule, not "Rules"`},
		{"rule name not DNS-1123", "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: My_Rule}\nspec: {}\n",
			`r.yaml:3:18: metadata.name: "My_Rule" is not a valid rule name`},
		{"missing name", "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {}\nspec: {}\n",
			`r.yaml:3:11: metadata.name: required`},
		{"missing watch", head + cm,
			`r.yaml:6:3: rule "r": spec.watch: required`},
		{"no resources and no status", head + watchNS,
			`r.yaml:6:3: rule "r": spec: a rule needs resources, a function, status, or some of them`},
		{"watch apiVersion templated", head + "  watch:\n    apiVersion: ${x}\n    kind: Namespace\n" + cm,
			`r.yaml:7:17: rule "r": spec.watch.apiVersion: must be literal (no ${})`},
		{"watch kind missing", head + "  watch:\n    apiVersion: v1\n" + cm,
			`r.yaml:7:5: rule "r": spec.watch.kind: required`},
		{"bad label selector", head + watchNS + "    labelSelector: \"a in (b\"\n" + cm,
			`r.yaml:9:20: rule "r": spec.watch.labelSelector:`},
		{"bad field selector", head + watchNS + "    fieldSelector: \"metadata.name\"\n" + cm,
			`r.yaml:9:20: rule "r": spec.watch.fieldSelector: invalid selector`},
		{"bad watch namespace", head + watchNS + "    namespace: Team_A\n" + cm,
			`r.yaml:9:16: rule "r": spec.watch.namespace: "Team_A" is not a valid namespace`},
		{"resource id twice", head + watchNS + cm + "    - id: cm\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: y}}\n",
			`r.yaml:15:11: rule "r": spec.resources[1].id: resource id "cm" used twice in this rule`},
		{"resource id not DNS-1123", head + watchNS + "  resources:\n    - id: Quota\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: y}}\n",
			`r.yaml:10:11: rule "r": spec.resources[0].id: "Quota" is not a valid resource id`},
		{"template kind computed, kinds not listed", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: \"${'ConfigMap'}\", metadata: {name: y}}\n",
			`r.yaml:11:17: rule "r": spec.resources[0].kinds: required: the template's apiVersion or kind is computed, so list every kind it may render ({apiVersion, kind} each)`},
		{"template one expression", head + watchNS + "  resources:\n    - id: a\n      template: \"${object.metadata}\"\n",
			`r.yaml:11:17: rule "r": spec.resources[0].template: must be a mapping of the child's fields, not one ${} expression`},
		{"kinds listed for a literal kind", head + watchNS + "  resources:\n    - id: a\n      kinds: [{apiVersion: v1, kind: Secret}]\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: y}}\n",
			`r.yaml:11:14: rule "r": spec.resources[0].kinds: only for a template whose apiVersion or kind is computed (${}): this one's is v1 ConfigMap`},
		{"kinds with a computed kind", head + watchNS + "  resources:\n    - id: a\n      kinds: [{apiVersion: v1, kind: \"${'x'}\"}]\n      template: {apiVersion: v1, kind: \"${'ConfigMap'}\", metadata: {name: y}}\n",
			`r.yaml:11:38: rule "r": spec.resources[0].kinds[0].kind: must be literal (no ${})`},
		{"kinds of a patch", head + watchNS + "  resources:\n    - id: a\n      mode: patch\n      kinds: [{apiVersion: v1, kind: ConfigMap}]\n      template: {apiVersion: v1, kind: \"${'ConfigMap'}\", metadata: {name: y, namespace: y}}\n",
			`r.yaml:12:14: rule "r": spec.resources[0].kinds: a mode: patch resource names the kind it patches literally`},
		{"kinds of two scopes", head + watchNS + "  resources:\n    - id: a\n      kinds: [{apiVersion: v1, kind: ConfigMap}, {apiVersion: v1, kind: Namespace}]\n      template: {apiVersion: v1, kind: \"${'ConfigMap'}\", metadata: {name: y}}\n",
			`r.yaml:11:14: rule "r": spec.resources[0].kinds: the kinds of one resource are all namespaced or all cluster-scoped, not ConfigMap (namespaced) and Namespace (cluster-scoped)`},
		{"template name missing", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {namespace: y}}\n",
			`r.yaml:11:61: rule "r": spec.resources[0].template.metadata.name: required`},
		{"generateName", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, generateName: b-}}\n",
			`r.yaml:11:85: rule "r": spec.resources[0].template.metadata.generateName: not supported`},
		{"reserved label", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, labels: {syncloop.dev/rule: x}}}\n",
			`r.yaml:11:80: rule "r": spec.resources[0].template.metadata.labels: "syncloop.dev/rule" is reserved`},
		{"ownerReferences", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, ownerReferences: []}}\n",
			`r.yaml:11:88: rule "r": spec.resources[0].template.metadata.ownerReferences: not supported`},
		{"unterminated template", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: \"a-${x\"}}\n",
			`r.yaml:11:71: rule "r": spec.resources[0].template.metadata.name: unterminated ${: missing }`},
		{"templated key error", head + watchNS + "  resources:\n    - id: a\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: a}\n        data:\n          ${objct.x}: v\n",
			`r.yaml:16:13: rule "r": spec.resources[0].template.data.${objct.x}: ${objct.x}: undeclared reference to 'objct'`},
		{"literal block expression", head + watchNS + "  when: |\n    object.metadata.name == 'a' &&\n      objet.x\n" + cm,
			`r.yaml:11:7: rule "r": spec.when: undeclared reference to 'objet'`},
		{"variable name not an identifier", head + watchNS + "  variables:\n    - name: my-var\n      expression: \"1\"\n" + cm,
			`r.yaml:10:13: rule "r": spec.variables[0].name: "my-var" is not a CEL identifier`},
		{"variable twice", head + watchNS + "  variables:\n    - {name: a, expression: \"1\"}\n    - {name: a, expression: \"2\"}\n" + cm,
			`r.yaml:11:14: rule "r": spec.variables[1].name: variable "a" declared twice`},
		{"bad deletionPolicy", head + watchNS + cm + "  deletionPolicy: Keep\n",
			`r.yaml:15:19: rule "r": spec.deletionPolicy: must be Delete or Orphan, not "Keep"`},
		{"workers zero", head + watchNS + cm + "  workers: 0\n",
			`r.yaml:15:12: rule "r": spec.workers: must be between 1 and 512, not 0`},
		{"workers a string", head + watchNS + cm + "  workers: two\n",
			`r.yaml:15:12: rule "r": spec.workers: must be an integer, not "two"`},
		{"resync not a duration", head + watchNS + cm + "  resyncPeriod: 10\n",
			`r.yaml:15:17: rule "r": spec.resyncPeriod: must be a string, not a number`},
		{"resync too short", head + watchNS + cm + "  resyncPeriod: 10ms\n",
			`r.yaml:15:17: rule "r": spec.resyncPeriod: must be 0 (off) or at least 1s, not 10ms`},
		{"maxDelay below baseDelay", head + watchNS + cm + "  rateLimit:\n    baseDelay: 1s\n    maxDelay: 10ms\n",
			`r.yaml:17:15: rule "r": spec.rateLimit.maxDelay: must be at least baseDelay (1s), not 10ms`},
		{"qps zero", head + watchNS + cm + "  rateLimit: {qps: 0}\n",
			`r.yaml:15:20: rule "r": spec.rateLimit.qps: must be more than 0`},
		{"burst zero", head + watchNS + cm + "  rateLimit: {burst: 0}\n",
			`r.yaml:15:22: rule "r": spec.rateLimit.burst: must be at least 1`},
		{"maxRetries negative", head + watchNS + cm + "  maxRetries: -1\n",
			`r.yaml:15:15: rule "r": spec.maxRetries: must be 0 (retry forever) or more, not -1`},
		{"forceConflicts not bool", head + watchNS + cm + "  forceConflicts: \"yes\"\n",
			`r.yaml:15:19: rule "r": spec.forceConflicts: must be true or false, not "yes"`},
		{"merge key", head + watchNS + cm + "  status:\n    <<: {a: b}\n",
			`r.yaml:16:5: rule "r": spec.status: YAML merge keys (<<) are not supported`},
		{"status not a mapping", head + watchNS + cm + "  status: ready\n",
			`r.yaml:15:11: rule "r": spec.status: must be a mapping, not a string`},
		{"rule name twice in a file", head + watchNS + cm + "---\n" + head + watchNS + cm,
			`r.yaml:16:1: rule "r": metadata.name: rule name used twice: also at r.yaml:1:1`},
		{"lookup id twice", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: a}\n    - {id: s, apiVersion: v1, kind: Secret, name: b}\n" + cm,
			`r.yaml:11:12: rule "r": spec.lookups[1].id: lookup id "s" used twice in this rule`},
		{"lookup unknown field", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, nam: a}\n" + cm,
			`r.yaml:10:45: rule "r": spec.lookups[0]: unknown field "nam" (did you mean "name"?)`},
		{"lookup kind templated", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: \"${'Secret'}\"}\n" + cm,
			`r.yaml:10:37: rule "r": spec.lookups[0].kind: must be literal (no ${})`},
		{"lookup bad selector", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Namespace, labelSelector: \"a in (b\"}\n" + cm,
			`r.yaml:10:63: rule "r": spec.lookups[0].labelSelector:`},
		{"lookup name and selector", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: a, labelSelector: x=y}\n" + cm,
			`r.yaml:10:69: rule "r": spec.lookups[0].labelSelector: a lookup by name reads one object`},
		{"lookup name a number literal", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: \"${1 + 2}\"}\n" + cm,
			`r.yaml:10:54: rule "r": spec.lookups[0].name: ${1 + 2}: must produce a string, but produces int`},
		{"lookup sees no variables", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: \"${variables.x}\"}\n" + cm,
			`r.yaml:10:64: rule "r": spec.lookups[0].name: ${variables.x}: undeclared variable "x"`},
		{"lookup bad namespace", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: a, namespace: A_B}\n" + cm,
			`r.yaml:10:65: rule "r": spec.lookups[0].namespace: "A_B" is not a valid namespace`},
		{"unknown lookup", head + watchNS + "  lookups:\n    - {id: src, apiVersion: v1, kind: Secret, name: a}\n" + cm + "        data: {x: \"${lookups.scr.metadata.name}\"}\n",
			`r.yaml:17:30: rule "r": spec.resources[0].template.data.x: ${lookups.scr.metadata.name}: undeclared lookup id "scr" (declared: src)`},
		{"when reads a lookup", head + watchNS + "  lookups:\n    - {id: src, apiVersion: v1, kind: Secret, name: a}\n  when: lookups.src != null\n" + cm,
			`r.yaml:11:17: rule "r": spec.when: undeclared lookup id "src" (no lookup ids are declared here)`},
		{"bad mode", head + watchNS + "  resources:\n    - id: a\n      mode: borrow\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
			`r.yaml:11:13: rule "r": spec.resources[0].mode: must be own or patch, not "borrow"`},
		{"cluster namespace literal invalid", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: A_B}}\n",
			`r.yaml:11:82: rule "r": spec.resources[0].template.metadata.namespace: "A_B" is not a valid namespace`},
		// Lookups that read lookups.
		{"lookup reads itself", head + watchDeploy + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: \"${lookups.s.metadata.name}\"}\n" + cm,
			`r.yaml:10:54: rule "r": spec.lookups[0]: dependency cycle: lookup "s" reads itself (lookups.s at r.yaml:10:54)`},
		{"lookups read each other", head + watchDeploy + "  lookups:\n    - {id: a, apiVersion: v1, kind: ConfigMap, name: \"${lookups.b.metadata.name}\"}\n    - {id: b, apiVersion: v1, kind: ConfigMap, name: \"${lookups.a.metadata.name}\"}\n" + cm,
			`r.yaml:10:57: rule "r": spec.lookups[0]: dependency cycle: "a" reads lookups.b at r.yaml:10:57, "b" reads lookups.a at r.yaml:11:57`},
		{"lookup reads lookups by a computed id", head + watchDeploy + "  lookups:\n    - {id: a, apiVersion: v1, kind: ConfigMap, name: x}\n    - {id: b, apiVersion: v1, kind: ConfigMap, name: \"${lookups[object.metadata.name].metadata.name}\"}\n" + cm,
			`r.yaml:11:57: rule "r": spec.lookups[1].name: ${lookups[object.metadata.name].metadata.name}: lookups must be followed by a lookup id here`},
		{"lookup reads an undeclared lookup", head + watchDeploy + "  lookups:\n    - {id: a, apiVersion: v1, kind: ConfigMap, name: \"${lookups.c.metadata.name}\"}\n" + cm,
			`r.yaml:10:65: rule "r": spec.lookups[0].name: ${lookups.c.metadata.name}: undeclared lookup id "c" (declared: a)`},
		{"required not a bool", head + watchDeploy + "  lookups:\n    - {id: a, apiVersion: v1, kind: ConfigMap, name: x, required: yes}\n" + cm,
			`r.yaml:10:67: rule "r": spec.lookups[0].required: must be true or false, not "yes"`},
		// Scopes known at load: built-in kinds, CRDs among the files.
		{"namespaced child without namespace under a cluster-scoped trigger", head + watchNS + "  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n",
			`r.yaml:11:61: rule "r": spec.resources[0].template.metadata.namespace: ConfigMap is namespaced and the trigger (Namespace) is cluster-scoped: set metadata.namespace`},
		{"namespace on a cluster-scoped child", head + watchDeploy + "  resources:\n    - id: a\n      template: {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {name: a, namespace: n}}\n",
			`r.yaml:11:110: rule "r": spec.resources[0].template.metadata.namespace: ClusterRole is cluster-scoped: leave metadata.namespace out`},
		{"templated namespace on a cluster-scoped child", head + watchDeploy + "  resources:\n    - id: a\n      template: {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRole, metadata: {name: a, namespace: \"${object.metadata.namespace}\"}}\n",
			`r.yaml:11:110: rule "r": spec.resources[0].template.metadata.namespace: ClusterRole is cluster-scoped: leave metadata.namespace out`},
		{"namespace on a cluster-scoped trigger", head + watchNS + "    namespace: team\n" + cm,
			`r.yaml:9:16: rule "r": spec.watch.namespace: Namespace is cluster-scoped: leave namespace out`},
		{"namespace on a cluster-scoped lookup", head + watchDeploy + "  lookups:\n    - {id: s, apiVersion: v1, kind: Namespace, namespace: p, name: a}\n" + cm,
			`r.yaml:10:59: rule "r": spec.lookups[0].namespace: Namespace is cluster-scoped: leave namespace out`},
		{"namespaced lookup by name without namespace under a cluster-scoped trigger", head + watchNS + "  lookups:\n    - {id: s, apiVersion: v1, kind: Secret, name: a}\n" + cm,
			`r.yaml:10:7: rule "r": spec.lookups[0].namespace: Secret is namespaced and the trigger (Namespace) is cluster-scoped: set namespace`},
		{"namespace on a cluster-scoped custom kind", head + watchDeploy + "  resources:\n    - id: a\n      template: {apiVersion: example.com/v1, kind: Tenant, metadata: {name: a, namespace: n}}\n" +
			"---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: tenants.example.com}\nspec: {group: example.com, scope: Cluster, names: {kind: Tenant, plural: tenants}, versions: [{name: v1, served: true, storage: true}]}\n",
			`r.yaml:11:91: rule "r": spec.resources[0].template.metadata.namespace: Tenant is cluster-scoped: leave metadata.namespace out`},
		// A rule never writes what it reads.
		{"child is a lookup's object", head + watchDeploy + "  lookups:\n    - {id: src, apiVersion: v1, kind: Secret, namespace: default, name: regcred}\n" +
			"  resources:\n    - id: copy\n      template: {apiVersion: v1, kind: Secret, metadata: {name: regcred, namespace: default}}\n",
			`r.yaml:13:65: rule "r": spec.resources[0].template.metadata.name: resource "copy" writes Secret default/regcred, the object lookup "src" reads: a rule never writes what it reads`},
		{"child is a lookup's object, both in the trigger's namespace", head + watchDeploy + "  lookups:\n    - {id: src, apiVersion: v1, kind: Secret, name: regcred}\n" +
			"  resources:\n    - id: copy\n      template: {apiVersion: v1, kind: Secret, metadata: {name: regcred}}\n",
			`r.yaml:13:65: rule "r": spec.resources[0].template.metadata.name: resource "copy" writes Secret regcred, the object lookup "src" reads`},
		{"adopt on a patch", head + watchNS + "  resources:\n    - id: a\n      mode: patch\n      adopt: true\n      template: {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n",
			`r.yaml:12:14: rule "r": spec.resources[0].adopt: a mode: patch resource writes onto objects it does not own without adopting them`},
		{"createOnce on a patch", head + watchNS + "  resources:\n    - id: a\n      mode: patch\n      createOnce: true\n      template: {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n",
			`r.yaml:12:19: rule "r": spec.resources[0].createOnce: a mode: patch resource creates nothing: leave createOnce out`},
		{"createOnce not a boolean", head + watchNS + "  createOnce: sometimes\n" + cm,
			`r.yaml:9:15: rule "r": spec.createOnce: must be true or false, not "sometimes"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantLoadError(t, tt.yaml, tt.want) })
	}
}

// wantLoadError parses doc as r.yaml and wants an error line starting with
// want; want "" wants none.
func wantLoadError(t *testing.T, doc, want string) {
	t.Helper()
	_, err := newLoader(t).Parse("r.yaml", []byte(doc))
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error = %v, want an ErrorList", err)
	}
	for _, e := range list {
		if strings.HasPrefix(e.Error(), want) {
			return
		}
	}
	t.Errorf("errors:\n%v\nwant one starting with:\n%s", err, want)
}

func TestAllErrorsReported(t *testing.T) {
	doc := head + watchNS + "  when: objet.x\n  wen: x\n" + cm + "  workers: 0\n"
	_, err := newLoader(t).Parse("r.yaml", []byte(doc))
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 3 {
		t.Fatalf("got %v, want 3 errors (when, wen, workers)", err)
	}
	for i := 1; i < len(list); i++ {
		if list[i-1].Pos.Line > list[i].Pos.Line {
			t.Errorf("errors not sorted by line: %v", err)
		}
	}
}

func TestDefaults(t *testing.T) {
	f, err := newLoader(t).Parse("r.yaml", []byte(head+watchNS+cm))
	if err != nil {
		t.Fatal(err)
	}
	r := f.Rules[0]
	if r.DeletionPolicy != DeletionDelete || !r.ForceConflicts || r.Workers != 64 || r.ResyncPeriod != DefaultResyncPeriod ||
		r.MaxRetries != 0 || r.RateLimit != (RateLimit{DefaultBaseDelay, DefaultMaxDelay, DefaultQPS, DefaultBurst}) {
		t.Errorf("defaults = %+v", r)
	}
	if r.Watch.LabelSelector.String() != "" || r.Watch.FieldSelector.String() != "" || r.Watch.When != nil {
		t.Errorf("watch defaults = %+v, when %v", r.Watch, r.Watch.When)
	}
	if r.Watch.GVK.Kind != "Namespace" || r.Resources[0].GVK.Kind != "ConfigMap" || r.Resources[0].GVK.Version != "v1" {
		t.Errorf("GVKs = %v, %v", r.Watch.GVK, r.Resources[0].GVK)
	}
	if r.Resources[0].CreateOnce || r.ReadsLive(r.Resources[0]) {
		t.Errorf("a resource is made once, or read live, by default")
	}
	// The rule's createOnce is its resources' default; a resource's own wins.
	two := strings.Replace(cm, "  resources:\n", "  resources:\n    - id: own\n      createOnce: false\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: own, namespace: default}}\n", 1)
	f, err = newLoader(t).Parse("r.yaml", []byte(head+watchNS+"  createOnce: true\n"+two))
	if err != nil {
		t.Fatal(err)
	}
	if res := f.Rules[0].Resources; len(res) != 2 || res[0].CreateOnce || !res[1].CreateOnce || !f.Rules[0].ReadsLive(res[1]) {
		t.Errorf("createOnce of the resources: %v, %v; want false (its own), true (the rule's), read live", res[0].CreateOnce, res[len(res)-1].CreateOnce)
	}
	want := `r.yaml:14:7: rule "r": spec.resources[1].createOnce: note: resource "cm" is made once: the rule remembers its children in each trigger's annotation created-once.syncloop.dev/r, so it needs patch on v1 Namespace`
	if len(f.Notes) != 1 || f.Notes[0].Error() != want {
		t.Errorf("notes %v, want\n%s", f.Notes, want)
	}
}

// TestBrokenLookupStillDeclared: a lookup with an error of its own is
// still declared: what reads it is not reported as reading an undeclared
// lookup (the error was "undeclared lookup id "secrets" (declared: cm)").
func TestBrokenLookupStillDeclared(t *testing.T) {
	doc := head + watchDeploy + "  lookups:\n    - {id: cm, apiVersion: v1, kind: ConfigMap, name: settings}\n" +
		"    - {id: secrets, apiVersion: v1, kind: Secret, labelSelector: \"${lookups.cm.data.nope.bad(}\"}\n" +
		cm + "        data: {n: \"${string(size(lookups.secrets))}\"}\n"
	_, err := newLoader(t).Parse("r.yaml", []byte(doc))
	if err == nil {
		t.Fatal("no error")
	}
	if strings.Contains(err.Error(), "undeclared lookup") {
		t.Errorf("errors:\n%v\nwant none about an undeclared lookup", err)
	}
	if !strings.Contains(err.Error(), "spec.lookups[1].labelSelector") {
		t.Errorf("errors:\n%v\nwant the selector's", err)
	}
}
