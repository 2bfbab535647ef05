package expr

import (
	"github.com/google/cel-go/common/types"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// maxSchemaDepth bounds the schema a struct type copies into a CRD: a
// value nested deeper is kept as written (x-kubernetes-preserve-unknown-
// fields), as no status needs more.
const maxSchemaDepth = 32

// OutputSchema is the OpenAPI schema of what the program produces, in
// the structural form a CustomResourceDefinition takes: the checker's
// type, and for an object read from a kind the schema of that object.
// exact is false when a part of it is dyn — what only evaluating tells —
// and is kept as written (x-kubernetes-preserve-unknown-fields). Only
// the programs of a status template know it; others give dyn.
func (p *Program) OutputSchema() (s *spec.Schema, exact bool) {
	if p.outSchema == nil {
		return AnySchema(), false
	}
	return p.outSchema, p.outExact
}

// AnySchema is the schema of a value of any type, kept as written.
func AnySchema() *spec.Schema {
	s := &spec.Schema{}
	s.AddExtension("x-kubernetes-preserve-unknown-fields", true)
	return s
}

// scalarSchemas are the OpenAPI type and format of CEL's scalar kinds.
var scalarSchemas = map[types.Kind]struct{ typ, format string }{
	types.StringKind:    {"string", ""},
	types.TimestampKind: {"string", "date-time"},
	types.DurationKind:  {"string", "duration"},
	types.BytesKind:     {"string", "byte"},
	types.IntKind:       {"integer", "int64"},
	types.UintKind:      {"integer", "int64"},
	types.DoubleKind:    {"number", "double"},
	types.BoolKind:      {"boolean", ""},
}

// schemaOfCEL is the structural schema of values of CEL type t.
func (p *provider) schemaOfCEL(t *types.Type) (*spec.Schema, bool) {
	if sc, ok := scalarSchemas[t.Kind()]; ok {
		s := &spec.Schema{}
		s.Type = spec.StringOrArray{sc.typ}
		s.Format = sc.format
		return s, true
	}
	switch t.Kind() {
	case types.ListKind:
		items, exact := p.schemaOfCEL(t.Parameters()[0])
		s := &spec.Schema{}
		s.Type = spec.StringOrArray{"array"}
		s.Items = &spec.SchemaOrArray{Schema: items}
		return s, exact
	case types.MapKind:
		if t.Parameters()[0].Kind() != types.StringKind {
			return AnySchema(), false
		}
		values, exact := p.schemaOfCEL(t.Parameters()[1])
		s := &spec.Schema{}
		s.Type = spec.StringOrArray{"object"}
		s.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: values}
		return s, exact
	case types.StructKind:
		if p == nil {
			break
		}
		if st, ok := p.lookup(t.TypeName()); ok && st.schema != nil {
			return structural(st.schema, 0)
		}
	case types.OpaqueKind:
		// optional_type(T): the value, or the field left out.
		if t.TypeName() == "optional_type" && len(t.Parameters()) == 1 {
			return p.schemaOfCEL(t.Parameters()[0])
		}
	}
	return AnySchema(), false
}

// structural is a copy of s, a kind's schema or a part of it, in the form
// a CRD takes: the types, formats, properties, items and values, and the
// extensions that say what any value is; validations, defaults, list
// types and descriptions are the source kind's business, not a status's.
func structural(s *spec.Schema, depth int) (*spec.Schema, bool) {
	for len(s.Type) == 0 && len(s.AllOf) == 1 && len(s.Properties) == 0 {
		s = &s.AllOf[0]
	}
	switch {
	case depth > maxSchemaDepth:
		return AnySchema(), false
	case flag(s, "x-kubernetes-int-or-string"):
		out := &spec.Schema{}
		out.AddExtension("x-kubernetes-int-or-string", true)
		return out, true
	case len(s.Type) != 1 && len(s.Properties) == 0:
		return AnySchema(), false
	}
	out := &spec.Schema{}
	out.Type = spec.StringOrArray{typeName(s)}
	if out.Type[0] == "" {
		out.Type[0] = "object"
	}
	exact := true
	switch out.Type[0] {
	case "object":
		if len(s.Properties) > 0 {
			out.Properties = make(map[string]spec.Schema, len(s.Properties))
			for name, ps := range s.Properties {
				ps := ps
				c, ok := structural(&ps, depth+1)
				out.Properties[name] = *c
				exact = exact && ok
			}
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil && len(s.Properties) == 0 {
			c, ok := structural(s.AdditionalProperties.Schema, depth+1)
			out.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: c}
			exact = exact && ok
		}
		if flag(s, "x-kubernetes-preserve-unknown-fields") || (len(out.Properties) == 0 && out.AdditionalProperties == nil) {
			out.AddExtension("x-kubernetes-preserve-unknown-fields", true)
		}
	case "array":
		items := AnySchema()
		ok := false
		if s.Items != nil && s.Items.Schema != nil {
			items, ok = structural(s.Items.Schema, depth+1)
		}
		out.Items = &spec.SchemaOrArray{Schema: items}
		exact = exact && ok
	case "string":
		switch s.Format {
		case "date-time", "date", "byte", "duration":
			out.Format = s.Format
		}
	case "integer":
		if s.Format == "int32" || s.Format == "int64" {
			out.Format = s.Format
		}
	case "number":
		if s.Format == "double" || s.Format == "float" {
			out.Format = s.Format
		}
	}
	return out, exact
}
