package rules

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	apicel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/rules/expr"
)

// CRD is the CustomResourceDefinition of the kind the rule defines
// (spec.api), as syncloop applies it: its versions, each with the status
// subresource and its printer columns; with more than one, conversion
// through syncloop's webhook (its CA bundle is the manager's to add); and
// the labels that name the rule. nil when the rule defines no kind.
func (r *Rule) CRD() *unstructured.Unstructured {
	a := r.API
	if a == nil {
		return nil
	}
	scope := apiextv1.NamespaceScoped
	if !a.Namespaced {
		scope = apiextv1.ClusterScoped
	}
	labels := map[string]string{LabelManagedBy: ManagedByValue, LabelRule: r.Name}
	if r.Installation != "" {
		labels[LabelInstallation] = r.Installation
	}
	crd := &apiextv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: a.CRDName(), Labels: labels},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: a.GVK.Group,
			Names: apiextv1.CustomResourceDefinitionNames{
				Kind: a.Kind, ListKind: a.Kind + "List", Plural: a.Plural, Singular: a.Singular,
				ShortNames: a.ShortNames, Categories: a.Categories,
			},
			Scope: scope,
		},
	}
	for _, v := range a.Versions {
		cv := apiextv1.CustomResourceDefinitionVersion{
			Name: v.Name, Served: v.Served, Storage: v.Storage, Deprecated: v.Deprecated,
			Schema:                   &apiextv1.CustomResourceValidation{OpenAPIV3Schema: a.jsonSchema(v)},
			Subresources:             &apiextv1.CustomResourceSubresources{Status: &apiextv1.CustomResourceSubresourceStatus{}},
			AdditionalPrinterColumns: v.columns(),
		}
		if v.Warning != "" {
			cv.DeprecationWarning = &v.Warning
		}
		crd.Spec.Versions = append(crd.Spec.Versions, cv)
	}
	if a.Converts() {
		crd.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter,
			Webhook: &apiextv1.WebhookConversion{ConversionReviewVersions: []string{"v1"}, ClientConfig: a.webhook.clientConfig()}}
		crd.Annotations = map[string]string{AnnotationConversion: string(a.source)}
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		panic(fmt.Sprintf("a generated CRD does not convert: %v", err)) // typed to untyped: cannot fail
	}
	delete(obj, "status")
	delete(obj["metadata"].(map[string]any), "creationTimestamp")
	return &unstructured.Unstructured{Object: obj}
}

// ConversionWebhook is where the API server reaches syncloop's conversion
// webhook (/convert): a URL (a syncloop outside the cluster, and tests),
// or the Service in front of syncloop's replicas.
type ConversionWebhook struct {
	URL string
	// Namespace and Name are the Service's; Port its port (443 when 0).
	Namespace, Name string
	Port            int32
}

// WebhookPath is where syncloop serves conversions.
const WebhookPath = "/convert"

// DefaultWebhookService is the name of the chart's Service in front of
// syncloop's conversion webhook.
const DefaultWebhookService = "syncloop-webhook"

// SetConversionWebhook makes the CRDs of later loads convert through w
// (the service syncloop-webhook in syncloop's namespace when zero).
func (l *Loader) SetConversionWebhook(w ConversionWebhook) { l.webhook = w }

// orDefault is w, or the default Service in namespace home.
func (w ConversionWebhook) orDefault(home string) ConversionWebhook {
	if w.URL == "" && w.Name == "" {
		w.Name = DefaultWebhookService
	}
	if w.URL == "" && w.Namespace == "" {
		w.Namespace = home
	}
	return w
}

func (w ConversionWebhook) clientConfig() *apiextv1.WebhookClientConfig {
	if w.URL != "" {
		u := w.URL
		return &apiextv1.WebhookClientConfig{URL: &u}
	}
	path, port := WebhookPath, cmp.Or(w.Port, 443)
	return &apiextv1.WebhookClientConfig{Service: &apiextv1.ServiceReference{Namespace: w.Namespace, Name: w.Name, Path: &path, Port: &port}}
}

// root is the schema of the kind's objects in version v: spec and
// status. A spec with no required field defaults to {} with its fields'
// defaults applied (the API server checks a default against the
// validations as it is, without defaulting it further), so that an
// object written without a spec gets them; otherwise spec is required.
func (a *API) root(v *Version) *spec.Schema {
	sp := *v.Spec
	root := &spec.Schema{}
	root.Type = spec.StringOrArray{"object"}
	if len(sp.Required) > 0 {
		root.Required = []string{"spec"}
	} else {
		sp.Default = map[string]any{}
		if v.defaults.spec != nil {
			sp.Default = v.defaults.spec
		}
	}
	root.Properties = map[string]spec.Schema{"spec": sp}
	if a.Status != nil {
		root.Properties["status"] = *a.Status
	}
	return root
}

// jsonSchema is root as a CRD holds it.
func (a *API) jsonSchema(v *Version) *apiextv1.JSONSchemaProps {
	data, err := json.Marshal(a.root(v))
	if err != nil {
		panic(fmt.Sprintf("a generated schema does not marshal: %v", err))
	}
	var out apiextv1.JSONSchemaProps
	if err := json.Unmarshal(data, &out); err != nil {
		panic(fmt.Sprintf("a generated schema does not unmarshal: %v", err))
	}
	return &out
}

// readyPath is where the Ready condition's status is.
const readyPath = `.status.conditions[?(@.type=="Ready")]`

// columns are the rule's printer columns, then Ready, its reason (with
// -o wide) and Age unless the rule names columns so.
func (v *Version) columns() []apiextv1.CustomResourceColumnDefinition {
	var out []apiextv1.CustomResourceColumnDefinition
	named := map[string]bool{}
	for _, c := range v.Columns {
		out = append(out, apiextv1.CustomResourceColumnDefinition{Name: c.Name, Type: c.Type, Format: c.Format,
			Description: c.Description, Priority: c.Priority, JSONPath: c.JSONPath})
		named[strings.ToLower(c.Name)] = true
	}
	for _, c := range []apiextv1.CustomResourceColumnDefinition{
		{Name: "Ready", Type: "string", JSONPath: readyPath + ".status", Description: "Whether every resource of the rule is ready"},
		{Name: "Reason", Type: "string", JSONPath: readyPath + ".reason", Priority: 1, Description: "Why it is or is not ready"},
		{Name: "Age", Type: "date", JSONPath: ".metadata.creationTimestamp"},
	} {
		if !named[strings.ToLower(c.Name)] {
			out = append(out, c)
		}
	}
	return out
}

// conditionsSchema is status.conditions: metav1.Condition items in a
// list keyed by type, as the API conventions have it.
func conditionsSchema() spec.Schema {
	str := func(format string) spec.Schema {
		s := *spec.StringProperty()
		s.Format = format
		return s
	}
	item := spec.Schema{}
	item.Type = spec.StringOrArray{"object"}
	item.Required = []string{"type", "status"}
	item.Properties = map[string]spec.Schema{
		"type": str(""), "status": str(""), "reason": str(""), "message": str(""),
		"lastTransitionTime": str("date-time"),
		"observedGeneration": *spec.Int64Property(),
	}
	s := spec.Schema{}
	s.Type = spec.StringOrArray{"array"}
	s.Items = &spec.SchemaOrArray{Schema: &item}
	s.AddExtension("x-kubernetes-list-type", "map")
	s.AddExtension("x-kubernetes-list-map-keys", []any{"type"})
	return s
}

// statusSchema types the kind's status from the rule's status template:
// a literal by its value, a string with ${} in it as a string, a sole
// ${expr} by what CEL says the expression produces (the schema of an
// object read from a kind is copied). What only evaluating tells (dyn)
// keeps any value, noted for -v=2. conditions is always the list of
// conditions syncloop keeps Ready in.
func (d *decoder) statusSchema(r *Rule, docVal any) *spec.Schema {
	s := &spec.Schema{}
	s.Type = spec.StringOrArray{"object"}
	s.Properties = map[string]spec.Schema{}
	if m, ok := lookup(docVal, expr.Path{"spec", "status"}).(map[string]any); ok && r.Status != nil {
		s = d.statusValue(r, m, nil)
	}
	if s.Properties == nil {
		s.Properties = map[string]spec.Schema{}
	}
	s.Properties["conditions"] = conditionsSchema()
	return s
}

func (d *decoder) statusValue(r *Rule, v any, path expr.Path) *spec.Schema {
	s := &spec.Schema{}
	switch v := v.(type) {
	case map[string]any:
		s.Type = spec.StringOrArray{"object"}
		s.Properties = map[string]spec.Schema{}
		for k, e := range v {
			if strings.Contains(k, "${") {
				d.noteDyn(r, path, "its keys are computed")
				return expr.AnySchema()
			}
			if e == nil || (len(path) == 0 && k == "conditions") {
				continue
			}
			s.Properties[k] = *d.statusValue(r, e, path.With(k))
		}
	case []any:
		s.Type = spec.StringOrArray{"array"}
		var items *spec.Schema
		for i, e := range v {
			is := d.statusValue(r, e, path.With(i))
			if items != nil && jsonOf(items) != jsonOf(is) {
				d.noteDyn(r, path, "its items differ in type")
				items = expr.AnySchema()
				break
			}
			items = is
		}
		if items == nil {
			items = expr.AnySchema()
		}
		s.Items = &spec.SchemaOrArray{Schema: items}
	case string:
		if sch, exact, ok := r.Status.SchemaAt(path); ok {
			if !exact {
				d.noteDyn(r, path, "CEL does not know the type of all of ${"+strings.TrimSuffix(strings.TrimPrefix(v, "${"), "}")+"}")
			}
			return sch
		}
		s.Type = spec.StringOrArray{"string"}
	case int64:
		s.Type = spec.StringOrArray{"integer"}
		s.Format = "int64"
	case float64:
		s.Type = spec.StringOrArray{"number"}
	case bool:
		s.Type = spec.StringOrArray{"boolean"}
	default:
		return expr.AnySchema()
	}
	return s
}

// noteDyn notes a status field whose CRD type keeps any value.
func (d *decoder) noteDyn(r *Rule, path expr.Path, why string) {
	field := PathField("spec.status", path)
	d.notes = append(d.notes, &Error{Pos: r.Status.PosOf(path), Rule: d.rule, Field: field,
		Msg: fmt.Sprintf("note: the CRD types status%s as any value (x-kubernetes-preserve-unknown-fields): %s", strings.TrimPrefix(field, "spec.status"), why)})
}

// toStructural is s as the API server's structural schema.
func toStructural(s *spec.Schema) (*structuralschema.Structural, error) {
	data, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var v1 apiextv1.JSONSchemaProps
	if err := json.Unmarshal(data, &v1); err != nil {
		return nil, err
	}
	var internal apiext.JSONSchemaProps
	if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(&v1, &internal, nil); err != nil {
		return nil, err
	}
	st, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, err
	}
	if errs := structuralschema.ValidateStructural(nil, st); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return st, nil
}

// checkAPI checks each version of the kind as the API server will:
// structural, and its x-kubernetes-validations compiled with the API
// server's CEL environment and within its cost limit; the errors point at
// the rule or the field of each. It sets the defaulting of each version.
func (d *decoder) checkAPI(a *API) {
	for _, v := range a.Versions {
		d.checkVersion(a, v)
	}
}

func (d *decoder) checkVersion(a *API, v *Version) {
	if ss, err := toStructural(v.Spec); err == nil && len(v.Spec.Required) == 0 {
		def := map[string]any{}
		defaulting.Default(def, ss)
		v.defaults.spec = def
	}
	st, err := toStructural(a.root(v))
	if err != nil {
		d.errorAt(v.Pos, v.field, "the generated schema is not one the API server takes: %v", err)
		return
	}
	v.defaults.apply = func(obj map[string]any) { defaulting.Default(obj, st) }
	spec := st.Properties["spec"]
	errsBefore := len(d.errs)
	d.checkValidations(v, &spec)
	if len(d.errs) == errsBefore {
		d.checkDefaults(v, &spec, "spec")
	}
}

// checkDefaults checks each default in s (at path) against the
// validations of its schema, as the API server does when the CRD is
// applied (each default as it is, not defaulted further): the spec's
// default is what an object written without a spec gets.
func (d *decoder) checkDefaults(v *Version, s *structuralschema.Structural, path string) {
	def := s.Default.Object
	if path == "spec" {
		def = nil // spec's own is root's, and nil: a spec is required
		if v.defaults.spec != nil {
			def = v.defaults.spec
		}
	}
	if def != nil {
		if cv := apicel.NewValidator(s, false, celconfig.PerCallLimit); cv != nil {
			errs, _ := cv.Validate(context.Background(), field.NewPath(path), s, runtime.DeepCopyJSONValue(def), nil, celconfig.RuntimeCELCostBudget)
			for _, e := range errs {
				if path == "spec" {
					d.errorAt(v.FieldPos("spec"), v.field+".spec", "an object written without a spec gets %s, its fields' defaults, which the API server refuses: %s: %s (give the fields defaults that pass, or make one required)",
						jsonOf(def), e.Field, e.Detail)
				} else {
					d.errorAt(v.FieldPos(path), v.field+"."+path, "the default %s, which the API server refuses: %s: %s (give the fields defaults that pass, or another default)", jsonOf(def), e.Field, e.Detail)
				}
			}
			if len(errs) > 0 {
				return
			}
		}
	}
	eachChild(s, path, func(c *structuralschema.Structural, at string) { d.checkDefaults(v, c, at) })
}

func jsonOf(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}

// Defines reports whether a and b define the same kind (group and kind)
// or resource (group and plural): only one rule may.
func (a *API) Defines(b *API) bool {
	return a.GVK.Group == b.GVK.Group && (a.Kind == b.Kind || a.Plural == b.Plural)
}
