package rules

import (
	"encoding/json"
	"strings"
)

// Field describes a field of the Rule and Test formats. The decoder takes
// the fields it knows from these trees, and `syncloop schema` prints them
// as a JSON Schema: the two cannot drift apart.
type Field struct {
	Name     string
	Type     string // object, array, string, integer, number, boolean, or "" for any value
	Desc     string
	Required bool
	Enum     []string
	// Fields are an object's fields; no others are allowed.
	Fields []*Field
	// Values, for an object without Fields, is the type of every value
	// (labels: strings); nil with no Fields: any object (a template).
	Values *Field
	// Items is an array's item type.
	Items *Field
	// AnyOf, for a field of no one Type, are the schemas its value may
	// have (a number or a percent).
	AnyOf []map[string]any
	// OneOf, for an object, names fields of which it has exactly one.
	OneOf []string
}

// fieldAmount is a field holding a number or a percent (Amount).
func fieldAmount(name, desc string) *Field {
	return &Field{Name: name, Desc: desc, AnyOf: []map[string]any{
		{"type": "integer", "minimum": 0},
		{"type": "string", "pattern": `^(100|[1-9]?[0-9])%$`},
	}}
}

func fieldObj(name, desc string, fields ...*Field) *Field {
	return &Field{Name: name, Type: "object", Desc: desc, Fields: fields}
}
func fieldStr(name, desc string) *Field { return &Field{Name: name, Type: "string", Desc: desc} }
func must(f *Field) *Field              { f.Required = true; return f }
func fieldList(name, desc string, items *Field) *Field {
	return &Field{Name: name, Type: "array", Desc: desc, Items: items}
}
func fieldMap(name, desc string) *Field {
	return &Field{Name: name, Type: "object", Desc: desc, Values: &Field{Type: "string"}}
}

// oneOf makes object f have exactly one of the fields names.
func oneOf(f *Field, names ...string) *Field { f.OneOf = names; return f }

// cel marks a field that holds a CEL expression.
func fieldCEL(name, desc string) *Field { return fieldStr(name, desc+" (CEL)") }

// anyObject is an object of any fields: templates, statuses, objects.
func fieldAny(name, desc string) *Field { return &Field{Name: name, Type: "object", Desc: desc} }

// RuleFormat is the Rule document (syncloop.dev/v1alpha1, kind Rule).
var RuleFormat = fieldObj("", "A syncloop rule: what to watch, and the objects and status to keep in sync with each object watched.",
	must(&Field{Name: "apiVersion", Type: "string", Enum: []string{APIVersion}, Desc: "Always " + APIVersion + "."}),
	must(&Field{Name: "kind", Type: "string", Enum: []string{Kind}, Desc: "Always " + Kind + "."}),
	must(fieldObj("metadata", "The rule's name (a DNS-1123 label), labels and annotations.",
		must(fieldStr("name", "The rule's name: unique among the rules loaded, a DNS-1123 label.")),
		fieldMap("labels", "Labels of the rule (not used by syncloop)."),
		fieldMap("annotations", "Annotations of the rule (not used by syncloop)."))),
	must(fieldObj("spec", "What the rule watches and keeps in sync. It needs resources, a function, status, or some of them.",
		apiFormat,
		fieldObj("watch", "The triggers: the objects whose changes reconcile the rule. Required unless spec.api defines the kind, which is then the one watched.",
			fieldStr("apiVersion", "The triggers' group/version, e.g. apps/v1 (literal); with spec.api, its apiVersion."),
			fieldStr("kind", "The triggers' kind, e.g. Deployment (literal); with spec.api, its kind."),
			fieldStr("namespace", "Only triggers in this namespace; all namespaces when empty."),
			fieldStr("labelSelector", "A label selector the API server applies to the watch, e.g. tier in (gold,silver)."),
			fieldStr("fieldSelector", "A field selector the API server applies to the watch, e.g. metadata.name=x.")),
		fieldCEL("when", "Whether the trigger wants the rule at all: false prunes its children. Sees object and rule only"),
		fieldList("lookups", "Objects the rule reads but does not own, from watched caches: one by name, or a list by labels.",
			fieldObj("", "A lookup, read as lookups.<id>.",
				must(fieldStr("id", "The name expressions read it by: lookups.<id>.")),
				must(fieldStr("apiVersion", "The looked-up kind's group/version (literal).")),
				must(fieldStr("kind", "The looked-up kind (literal).")),
				fieldStr("namespace", "Its namespace; ${} over the trigger and other lookups allowed. Defaults to the trigger's for namespaced kinds."),
				fieldStr("name", "Its name, for one object (null when absent); ${} over the trigger and other lookups allowed. Without it, a list."),
				fieldStr("labelSelector", "For a list: a label selector; ${} over the trigger and other lookups allowed."),
				&Field{Name: "required", Type: "boolean", Desc: "While the object is absent (a list: empty), the resources that read it wait, neither applied nor pruned, and Ready is False with reason WaitingForLookup<Id> (default false: it reads as null, or an empty list)."})),
		fieldList("variables", "Named values computed once per reconcile, in order; each sees the ones before it.",
			fieldObj("", "A variable, read as variables.<name>.",
				must(fieldStr("name", "A CEL identifier.")),
				must(fieldCEL("expression", "Its value")))),
		fieldList("resources", "The objects the rule keeps in sync with each trigger, in dependency order of their children.<id> references.",
			oneOf(fieldObj("", "A resource: one template, one per forEach item, or a function's children.",
				must(fieldStr("id", "The resource's id: a DNS-1123 label, read by others as children.<id>.")),
				&Field{Name: "mode", Type: "string", Enum: []string{string(ModeOwn), string(ModePatch)},
					Desc: "own (default): syncloop creates, owns and prunes the objects; patch: it only sets the template's fields on an object it does not own."},
				fieldCEL("when", "Whether the trigger wants this resource; false prunes its children"),
				fieldCEL("forEach", "A list: one object per item, read as item and index"),
				fieldObj("clusters", "Put the children in other clusters of the inventory (kubeconfig Secrets, Cluster API's convention) instead of syncloop's own: one set per cluster selected, rendered with cluster (name, labels) in their expressions; children.<id> is then a list. A cluster that leaves the inventory keeps its children as they are (orphaned), as does one that leaves the selection unless onLeave says Delete; a cluster that does not answer keeps them too, and Ready says ClusterUnreachable.",
					fieldCEL("selector", "Whether a cluster gets the children: reads cluster.name, cluster.labels, and the trigger, variables and lookups"),
					fieldList("names", "The clusters by name; ${} over the trigger, variables and lookups allowed.", fieldStr("", "A cluster's name.")),
					&Field{Name: "onLeave", Type: "string", Enum: []string{string(DeletionOrphan), string(DeletionDelete)},
						Desc: "What becomes of the children in a cluster the trigger selects no more: Orphan (default) leaves them as they are; Delete deletes them, unless the children leaving a cluster are more than rollout.maxPrunes of the rule's children there: then none is deleted until maxPrunes is raised."}),
				fieldList("readyWhen", "Conditions on the live child (self) that make the resource ready; dependents wait for it.", fieldCEL("", "A readiness condition on self")),
				&Field{Name: "deletionPolicy", Type: "string", Enum: []string{string(DeletionDelete), string(DeletionOrphan)},
					Desc: "Delete (default): children are deleted when no longer wanted; Orphan: they are left in place."},
				&Field{Name: "adopt", Type: "boolean", Desc: "Take over an object that exists under a child's name and carries no syncloop ownership (default: the rule's adopt, false). Another rule's or trigger's child is never taken over."},
				&Field{Name: "createOnce", Type: "boolean", Desc: "Create each child once and leave it alone: never updated, not created again once deleted while the trigger still renders it (default: the rule's createOnce, false). Kyverno's synchronize: false."},
				&Field{Name: "kinds", Type: "array", Desc: "For a template whose apiVersion or kind is computed (${}): every kind it may render, each {apiVersion, kind}, all namespaced or all cluster-scoped. A rendered kind not listed fails the trigger.",
					Items: fieldObj("", "", must(fieldStr("apiVersion", "The kind's group/version.")), must(fieldStr("kind", "The kind.")))},
				&Field{Name: "template", Type: "object", Desc: "The object to apply: any fields of its kind, strings may hold ${CEL}. apiVersion and kind are literal, or computed and listed in kinds. Required unless function computes the children.",
					Fields: nil},
				functionFormat), "template", "function")),
		ruleFunctionFormat,
		fieldAny("status", "Fields to write to the trigger's status subresource; strings may hold ${CEL} and see children and ready."),
		&Field{Name: "deletionPolicy", Type: "string", Enum: []string{string(DeletionDelete), string(DeletionOrphan)},
			Desc: "The default of the resources' deletionPolicy."},
		&Field{Name: "adopt", Type: "boolean", Desc: "The default of the resources' adopt (default false: an existing object syncloop does not own is a conflict, never written)."},
		&Field{Name: "createOnce", Type: "boolean", Desc: "The default of the resources' createOnce (default false: children are kept as the template says)."},
		&Field{Name: "teardown", Type: "string", Enum: []string{string(TeardownOrdered), string(TeardownUnordered)},
			Desc: "How a deleted trigger's children go. Ordered: a finalizer holds the trigger while its children are deleted dependents first, in waves (the default with api). Unordered: the garbage collector deletes them at once (the default otherwise)."},
		&Field{Name: "removalPolicy", Type: "string", Enum: []string{string(DeletionOrphan), string(DeletionDelete)},
			Desc: "What becomes of the rule's children when the rule is removed. Orphan (default): they stay. Delete: they are deleted, dependents first, unless they are more than rollout.maxPrunes of them (the removal then halts and deletes none)."},
		&Field{Name: "forceConflicts", Type: "boolean", Desc: "Take over fields another manager owns when applying (default true)."},
		&Field{Name: "workers", Type: "integer", Desc: "Reconcile workers of the rule (default 64)."},
		fieldStr("resyncPeriod", "How often every trigger is reconciled again, a Go duration (default 10m; 0 turns it off)."),
		fieldObj("rateLimit", "Retry backoff and rate of the rule's queue.",
			fieldStr("baseDelay", "First retry delay, a Go duration."),
			fieldStr("maxDelay", "Longest retry delay, a Go duration."),
			&Field{Name: "qps", Type: "number", Desc: "Reconciles per second the queue hands out."},
			&Field{Name: "burst", Type: "integer", Desc: "Reconciles the queue may hand out at once."}),
		&Field{Name: "maxRetries", Type: "integer", Desc: "Retries of a failing trigger before it waits for its next change (0: forever)."},
		fieldStr("serviceAccountName", "The ServiceAccount the rule acts as: its lists, watches, lookups and writes impersonate it, so RBAC bounds what it may do (default: --default-service-account, else syncloop's own)."),
		fieldStr("serviceAccountNamespace", "The namespace of serviceAccountName (default: syncloop's)."),
		&Field{Name: "revisionHistoryLimit", Type: "integer", Desc: "Revisions of the rule kept in the cluster as ControllerRevisions (default 10)."},
		rolloutFormat)),
)

// functionFormat is a resource's function: a WebAssembly module or a
// webhook that computes its children.
var functionFormat = oneOf(fieldObj("function", "Instead of a template: code that computes the resource's children — a WebAssembly module (a WASI command) run in process, or a webhook. It reads the trigger, lookups, variables and the children of the resources in reads as JSON (on stdin, or POSTed), and writes {\"children\": [objects]}; each child must be of a kind listed in kinds.",
	functionFields(fieldList("reads", "Resources whose children the function is given as children.<id>; it is run after them, once they are ready.", fieldStr("", "A resource id.")))...),
	"wasm", "webhook")

// ruleFunctionFormat is spec.function: the rule's function, a sync hook.
var ruleFunctionFormat = oneOf(fieldObj("function", "The rule's function: code that computes the trigger's children and status, as a Metacontroller sync hook does, and speaks its protocol — a request of {controller, parent, children, related, finalizing} (children: the trigger's in the cluster, by kind then name; related: what the lookups read), a response of {status, children, resyncAfterSeconds}. A WebAssembly module reads the request on stdin and writes the response on stdout; a webhook is POSTed it. Its children are a resource with id sync.",
	functionFields(kindsField("Every kind the function may return, each {apiVersion, kind}, all namespaced or all cluster-scoped: RBAC, identities and the chart know them. Another kind fails the trigger."),
		oneOf(fieldObj("finalize", "Metacontroller's finalize hook: while a trigger is being deleted, this is called instead (the same request, finalizing true) until it answers finalized: true; the rule's finalizer holds the trigger meanwhile, and its children and status are kept as it answers. Then the trigger's children are torn down and the finalizer comes off.",
			functionFields()...), "wasm", "webhook"),
		oneOf(fieldObj("customize", "Metacontroller's customize hook: called with {controller, parent} once per trigger (again when the trigger changes), it answers {relatedResources: [{apiVersion, resource, namespace, names, labelSelector}]}, the objects the rule's function is then given as related. Namespace defaults to the trigger's for a namespaced kind; the objects come from syncloop's caches, and a change to them calls the rule's function again.",
			functionFields(kindsField("Every kind the customize function may name, each {apiVersion, kind}: RBAC, the chart and the informers know them. Another kind fails the trigger."))...), "wasm", "webhook"))...),
	"wasm", "webhook")

// kindsField is a function's required list of kinds.
func kindsField(desc string) *Field {
	return &Field{Name: "kinds", Type: "array", Required: true, Desc: desc,
		Items: fieldObj("", "", must(fieldStr("apiVersion", "The kind's group/version.")), must(fieldStr("kind", "The kind.")))}
}

// functionFields are the fields of a function: how it is called, and
// extra.
func functionFields(extra ...*Field) []*Field {
	return append(extra,
		fieldStr("wasm", "The module's file name, in the rule file's directory (a ConfigMap holding the rules holds it too, in binaryData); a name ending .wasm.gz is a gzipped module."),
		oneOf(fieldObj("webhook", "Instead of a module: an HTTP endpoint the input is POSTed to as JSON, whose response body is the output (Metacontroller's hook convention). Called only where the cluster is: offline, a test gives its responses. A failing or slow hook fails its trigger, retried with backoff; the rule's other triggers go on.",
			fieldStr("url", "The hook's URL, http or https."),
			fieldObj("service", "Instead of url: an in-cluster Service, called at protocol://name.namespace:port/path.",
				must(fieldStr("name", "The Service's name.")),
				must(fieldStr("namespace", "The Service's namespace.")),
				&Field{Name: "port", Type: "integer", Desc: "Its port (default 80)."},
				&Field{Name: "protocol", Type: "string", Enum: []string{"http", "https"}, Desc: "http (default) or https."}),
			fieldStr("path", "With service: the path of the hook, e.g. /sync."),
			fieldStr("caBundle", "For https: the PEM certificates, base64, the server's certificate must chain to (default: the system's).")),
			"url", "service"),
		fieldStr("sha256", "For a module: its sha256 (64 hex digits); the load fails if the file differs. Recorded in the rule's revisions either way."),
		fieldStr("timeout", "How long one call may run, a Go duration (default 2s for a module, 10s for a webhook; at most 1m); past it the call is stopped and the trigger fails."),
		&Field{Name: "serve", Type: "boolean", Desc: "For a module: it stays up between calls: started with SYNCLOOP_FUNCTION_MODE=serve, it reads one request per line on stdin and writes one response per line on stdout, until stdin ends (default false: a fresh start per call, which for a Go module costs about 10 ms)."})
}

// apiFormat is spec.api: the kind a rule defines and serves, whose
// CustomResourceDefinition syncloop generates and keeps.
var apiFormat = fieldObj("api", "A kind the rule defines and serves: syncloop generates its CustomResourceDefinition from this schema and the rule's status, keeps it in the cluster, and watches the kind.",
	append([]*Field{
		must(fieldStr("apiVersion", "The kind's group and the version the rule reads, e.g. example.syncloop.dev/v1: the group a domain with a dot, the version like v1 or v1alpha1.")),
		must(fieldStr("kind", "The kind, CamelCase, e.g. App.")),
		&Field{Name: "scope", Type: "string", Enum: []string{"Namespaced", "Cluster"}, Desc: "Namespaced (default) or Cluster."},
		fieldStr("plural", "The resource name, lower case; derived from the kind when left out (App: apps, Policy: policies)."),
		fieldStr("singular", "The singular name, lower case; the kind in lower case when left out."),
		fieldList("shortNames", "Short names kubectl accepts, lower case.", fieldStr("", "A short name.")),
		fieldList("categories", "Categories the kind belongs to (kubectl get <category>).", fieldStr("", "A category.")),
		fieldList("versions", "The kind's versions, each with its schema, instead of spec, types, validations and printerColumns here: one is stored, one is the hub the others convert to and from (the storage version unless marked).",
			fieldObj("", "A version of the kind.", append([]*Field{
				must(fieldStr("name", "The version, e.g. v1 or v1alpha1.")),
				&Field{Name: "storage", Type: "boolean", Desc: "The version objects are stored in: exactly one has it (with one version, that one)."},
				&Field{Name: "hub", Type: "boolean", Desc: "The version the others convert to and from (default: the storage version): moving the storage version leaves the conversions as they are."},
				&Field{Name: "served", Type: "boolean", Desc: "Whether clients may read and write it (default true)."},
				&Field{Name: "deprecated", Type: "boolean", Desc: "The API server warns every client that uses it."},
				fieldStr("deprecationWarning", "The warning, instead of the API server's own."),
				conversionFormat("toHub", "How an object of this version becomes one of the hub (the storage version, unless a version is marked hub)."),
				conversionFormat("fromHub", "How an object of the hub becomes one of this version."),
			}, versionFormat()...)...)),
	}, versionFormat()...)...)

// versionFormat are the fields of a version of a kind: spec.api's own for
// a kind of one version, each of spec.api.versions' otherwise.
func versionFormat() []*Field {
	return []*Field{
		fieldAny("spec", "The fields of the kind's spec in kro's simple schema: a name to a type and markers (\"integer | default=1 minimum=0\") or to a mapping of fields."),
		fieldAny("types", "Named types the spec's fields may use: a name to a mapping of fields, or to a type with markers."),
		fieldList("validations", "CEL rules on the spec (x-kubernetes-validations): the API server refuses an object that breaks one.",
			fieldObj("", "A validation rule; self is the spec, oldSelf the spec before an update.",
				must(fieldCEL("rule", "What must hold")),
				fieldStr("message", "The error when it does not."),
				fieldCEL("messageExpression", "The error, computed"),
				fieldStr("reason", "FieldValueInvalid (default), FieldValueForbidden, FieldValueRequired or FieldValueDuplicate."),
				fieldStr("fieldPath", "The field the error is reported at, e.g. .replicas."))),
		fieldList("printerColumns", "Columns kubectl get shows, after NAME and before READY and AGE, which are always there.",
			fieldObj("", "A column.",
				must(fieldStr("name", "The column's title.")),
				must(&Field{Name: "type", Type: "string", Enum: []string{"string", "integer", "number", "boolean", "date"}, Desc: "The values' type."}),
				must(fieldStr("jsonPath", "Where the value is, e.g. .spec.replicas.")),
				fieldStr("description", "What the column shows."),
				fieldStr("format", "How the value is shown, e.g. int32 or date-time."),
				&Field{Name: "priority", Type: "integer", Desc: "0 (default): shown always; more: only with -o wide."})),
	}
}

// conversionFormat is a conversion between a version and the storage one.
func conversionFormat(name, desc string) *Field {
	return fieldObj(name, desc,
		fieldAny("spec", "The converted object's spec: a template over object, the object being converted; fields of the same name and type in both versions are copied unless written here."),
		fieldList("lossy", "Fields of the converted object (e.g. spec.ports) that nothing here produces: left unset, or restored from the round-trip annotation when the object was this version before.",
			fieldStr("", "A field path, e.g. spec.ports.")))
}

// objectRefFormat names an object in a test.
func objectRefFormat(name, desc string) *Field {
	return fieldObj(name, desc,
		fieldStr("apiVersion", "Its group/version; any when left out."),
		must(fieldStr("kind", "Its kind.")),
		fieldStr("namespace", "Its namespace; any when left out."),
		must(fieldStr("name", "Its name.")))
}

// TestFormat is the Test document (syncloop.dev/v1alpha1, kind Test).
var TestFormat = fieldObj("", "A test of rules without a cluster: render them against objects and check what they make of each trigger.",
	must(&Field{Name: "apiVersion", Type: "string", Enum: []string{APIVersion}, Desc: "Always " + APIVersion + "."}),
	must(&Field{Name: "kind", Type: "string", Enum: []string{TestKind}, Desc: "Always " + TestKind + "."}),
	must(fieldObj("metadata", "The test's name.", must(fieldStr("name", "The name PASS and FAIL lines show.")))),
	must(fieldList("rules", "Rule files or directories, relative to this file.", fieldStr("", "A path."))),
	must(fieldList("objects", "Object files or directories, relative to this file: triggers, lookup targets, CRDs, live children.", fieldStr("", "A path."))),
	fieldList("expect", "What the rules must make of triggers (required unless conversions are given).",
		fieldObj("", "What one rule must make of one trigger.",
			must(fieldStr("rule", "The rule's name.")),
			must(objectRefFormat("trigger", "The trigger.")),
			fieldList("children", "Objects that must be rendered: partial objects whose fields must all match.",
				fieldAny("", "A partial object: apiVersion, kind, metadata.name and the fields to check.")),
			fieldAny("clusters", "For resources that target clusters: by cluster name, the children that cluster must get, as children (an empty list: none). The clusters offline are the kubeconfig Secrets among the objects (label "+LabelClusterName+")."),
			fieldList("absent", "Objects that must not be rendered.", objectRefFormat("", "An object.")),
			fieldList("conflicts", "Children that must be conflicts: not applied, an object among the objects that the rule may not take over holds their name, or a lookup reads them. A conflict not listed fails the test.", objectRefFormat("", "An object.")),
			fieldAny("status", "A partial status that must match."),
			&Field{Name: "skipped", Type: "boolean", Desc: "Whether the rule's when is false for the trigger."},
			fieldStr("error", "A substring of the error rendering must fail with."))),
	fieldList("conversions", "Conversions between the versions of a kind a rule defines (spec.api.versions): an object in one version, and what it must be in another. Besides these, every object among the objects of such a kind must come back unchanged from every other version.",
		fieldObj("", "One conversion.",
			must(fieldAny("object", "The object converted: apiVersion, kind, metadata.name and its fields.")),
			must(fieldAny("expect", "What it must become: a partial object in the version converted to, whose fields must all match.")))),
	fieldList("responses", "What a rule's webhooks answer: a webhook is not called offline, and a trigger whose webhook has no response here fails with an error saying so.",
		fieldObj("", "A webhook's recorded response for one trigger.",
			must(fieldStr("rule", "The rule's name.")),
			fieldStr("resource", "The id of the resource whose function is the webhook (default sync: the rule's function)."),
			must(objectRefFormat("trigger", "The trigger.")),
			must(fieldAny("response", "The response body: {status, children, resyncAfterSeconds} for the rule's function, {children} for a resource's.")))),
)

// known are the fields of the object at path in f ("spec.watch";
// "spec.resources" for an array's items), in order.
func (f *Field) known(path string) []string {
	node := f
	if path != "" {
		for _, name := range strings.Split(path, ".") {
			node = node.field(name)
			if node.Items != nil {
				node = node.Items
			}
		}
	}
	names := make([]string, len(node.Fields))
	for i, c := range node.Fields {
		names[i] = c.Name
	}
	return names
}

func (f *Field) field(name string) *Field {
	for _, c := range f.Fields {
		if c.Name == name {
			return c
		}
	}
	panic("rules: no field " + name + " in the format")
}

// JSONSchema is the JSON Schema (draft 2020-12) of Rule and Test documents,
// for editors: a document is one or the other by its kind.
func JSONSchema() ([]byte, error) {
	s := map[string]any{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         "https://syncloop.dev/schemas/v1alpha1.json",
		"title":       "syncloop Rule or Test",
		"description": APIVersion + " Rule and Test documents (a Test by its kind). Generated by `syncloop schema`.",
		"if":          map[string]any{"properties": map[string]any{"kind": map[string]any{"const": TestKind}}, "required": []string{"kind"}},
		"then":        map[string]any{"$ref": "#/$defs/Test"},
		"else":        map[string]any{"$ref": "#/$defs/Rule"},
		"$defs":       map[string]any{"Rule": RuleFormat.jsonSchema(), "Test": TestFormat.jsonSchema()},
	}
	return json.MarshalIndent(s, "", "  ")
}

func (f *Field) jsonSchema() map[string]any {
	s := map[string]any{}
	if f.Desc != "" {
		s["description"] = f.Desc
	}
	if f.Type != "" {
		s["type"] = f.Type
	}
	if len(f.Enum) > 0 {
		s["enum"] = f.Enum
	}
	if len(f.AnyOf) > 0 {
		s["anyOf"] = f.AnyOf
	}
	switch {
	case f.Items != nil:
		s["items"] = f.Items.jsonSchema()
	case len(f.Fields) > 0:
		props := map[string]any{}
		var required []string
		for _, c := range f.Fields {
			props[c.Name] = c.jsonSchema()
			if c.Required {
				required = append(required, c.Name)
			}
		}
		s["properties"] = props
		if len(required) > 0 {
			s["required"] = required
		}
		if len(f.OneOf) > 0 {
			var one []any
			for _, name := range f.OneOf {
				one = append(one, map[string]any{"required": []string{name}})
			}
			s["oneOf"] = one
		}
		s["additionalProperties"] = false
	case f.Values != nil:
		s["additionalProperties"] = f.Values.jsonSchema()
	}
	return s
}
