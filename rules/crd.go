package rules

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
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
// (spec.api), as syncloop applies it: one version, served and stored, the
// status subresource, the printer columns, and the labels that name the
// rule. nil when the rule defines no kind.
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
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: a.GVK.Version, Served: true, Storage: true,
				Schema:                   &apiextv1.CustomResourceValidation{OpenAPIV3Schema: a.jsonSchema()},
				Subresources:             &apiextv1.CustomResourceSubresources{Status: &apiextv1.CustomResourceSubresourceStatus{}},
				AdditionalPrinterColumns: a.columns(),
			}},
		},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(crd)
	if err != nil {
		panic(fmt.Sprintf("a generated CRD does not convert: %v", err)) // typed to untyped: cannot fail
	}
	delete(obj, "status")
	delete(obj["metadata"].(map[string]any), "creationTimestamp")
	return &unstructured.Unstructured{Object: obj}
}

// root is the schema of the kind's objects: spec and status. A spec with
// no required field defaults to {} with its fields' defaults applied (the
// API server checks a default against the validations as it is, without
// defaulting it further), so that an object written without a spec gets
// them; otherwise spec is required.
func (a *API) root() *spec.Schema {
	sp := *a.Spec
	root := &spec.Schema{}
	root.Type = spec.StringOrArray{"object"}
	if len(sp.Required) > 0 {
		root.Required = []string{"spec"}
	} else {
		sp.Default = map[string]any{}
		if a.specDefault != nil {
			sp.Default = a.specDefault
		}
	}
	root.Properties = map[string]spec.Schema{"spec": sp}
	if a.Status != nil {
		root.Properties["status"] = *a.Status
	}
	return root
}

// jsonSchema is root as a CRD holds it.
func (a *API) jsonSchema() *apiextv1.JSONSchemaProps {
	data, err := json.Marshal(a.root())
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
func (a *API) columns() []apiextv1.CustomResourceColumnDefinition {
	var out []apiextv1.CustomResourceColumnDefinition
	named := map[string]bool{}
	for _, c := range a.Columns {
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

// checkAPI checks the kind's schema as the API server will: structural,
// and its x-kubernetes-validations compiled with the API server's CEL
// environment and within its cost limit; the errors point at the rule or
// the field of each. validations are the nodes of spec.api.validations.
// It sets the defaulting of a.
func (d *decoder) checkAPI(a *API, validations []*yaml.Node) {
	if ss, err := toStructural(a.Spec); err == nil && len(a.Spec.Required) == 0 {
		def := map[string]any{}
		defaulting.Default(def, ss)
		a.specDefault = def
	}
	st, err := toStructural(a.root())
	if err != nil {
		d.errorAt(a.Pos, "spec.api", "the generated schema is not one the API server takes: %v", err)
		return
	}
	a.defaults = func(obj map[string]any) { defaulting.Default(obj, st) }
	spec := st.Properties["spec"]
	errsBefore := len(d.errs)
	d.checkValidations(a, &spec, validations)
	if len(d.errs) == errsBefore {
		d.checkDefaults(a, &spec, "spec")
	}
}

// checkDefaults checks each default in s (at path) against the
// validations of its schema, as the API server does when the CRD is
// applied (each default as it is, not defaulted further): the spec's
// default is what an object written without a spec gets.
func (d *decoder) checkDefaults(a *API, s *structuralschema.Structural, path string) {
	def := s.Default.Object
	if path == "spec" {
		def = nil // spec's own is root's, and nil: a spec is required
		if a.specDefault != nil {
			def = a.specDefault
		}
	}
	if def != nil {
		if v := apicel.NewValidator(s, false, celconfig.PerCallLimit); v != nil {
			errs, _ := v.Validate(context.Background(), field.NewPath(path), s, runtime.DeepCopyJSONValue(def), nil, celconfig.RuntimeCELCostBudget)
			for _, e := range errs {
				if path == "spec" {
					d.errorAt(a.FieldPos("spec"), "spec.api.spec", "an object written without a spec gets %s, its fields' defaults, which the API server refuses: %s: %s (give the fields defaults that pass, or make one required)",
						jsonOf(def), e.Field, e.Detail)
				} else {
					d.errorAt(a.FieldPos(path), "spec.api."+path, "the default %s, which the API server refuses: %s: %s (give the fields defaults that pass, or another default)", jsonOf(def), e.Field, e.Detail)
				}
			}
			if len(errs) > 0 {
				return
			}
		}
	}
	eachChild(s, path, func(c *structuralschema.Structural, at string) { d.checkDefaults(a, c, at) })
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
