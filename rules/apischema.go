package rules

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// The API schema language: kro's simple schema, so that a
// ResourceGraphDefinition's schema ports over unchanged. A kind's spec is
// a mapping of field names to a type — a string, `type | markers` — or to
// a mapping of fields (a nested object):
//
//	image: string | required=true description="Container image"
//	replicas: integer | default=1 minimum=0 maximum=50
//	env: map[string]string
//	ingress:
//	  enabled: boolean | default=false
//
// Types are string, integer, boolean, number (float is its synonym),
// object (any fields, kept as written), []T, map[string]T and the named
// types a rule declares (a mapping of fields, or a type with markers).
// compileAPISchema turns one into the OpenAPI v3 schema a
// CustomResourceDefinition takes: structural (every field typed), with
// every mistake an error at its line and column.

// scalarTypes are the simple schema's scalar types, with their OpenAPI
// type.
var scalarTypes = map[string]string{"string": "string", "integer": "integer", "boolean": "boolean", "number": "number", "float": "number"}

// schemaMarkers are the markers a field's type may carry.
var schemaMarkers = []string{"required", "default", "description", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern",
	"immutable", "validation", "uniqueItems", "minItems", "maxItems", "listType", "listMapKey"}

// schemaCompiler compiles one kind's simple schema.
type schemaCompiler struct {
	d          *decoder
	types      map[string]*yaml.Node // named types, by name
	typesField string                // where they are declared, for errors
	done       map[string]*spec.Schema
	failed     map[string]bool
	resolving  []string // named types being compiled: a cycle is an error
	// requiredTypes are the named types marked required=true: a field
	// of one is required, as in kro.
	requiredTypes map[string]bool
}

// compileAPISchema compiles the simple schema of a kind's spec (specNode,
// at specField) with the named types of typesNode (nil: none) into an
// OpenAPI v3 schema; nil when it has errors (reported to d). Every named
// type is compiled, used or not, so that its mistakes are found.
func (d *decoder) compileAPISchema(specNode *yaml.Node, specField string, typesNode *yaml.Node, typesField string) *spec.Schema {
	c := &schemaCompiler{d: d, types: map[string]*yaml.Node{}, typesField: typesField,
		done: map[string]*spec.Schema{}, failed: map[string]bool{}, requiredTypes: map[string]bool{}}
	errsBefore := len(d.errs)
	if typesNode != nil {
		c.declareTypes(typesNode)
	}
	s := c.object(specNode, specField)
	names := make([]string, 0, len(c.types))
	for name := range c.types {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		c.named(name, nil, 0)
	}
	if len(d.errs) > errsBefore {
		return nil
	}
	if err := checkSchemaSize(s); err != nil {
		d.errorf(specNode, specField, "%v", err)
		return nil
	}
	return s
}

// A kind's schema is bounded: the API server stores it in the CRD (at
// most about 1.5 MB) and syncloop types expressions by it. Named types
// used in several places repeat in the CRD, so a short file can describe
// a schema of exponential size, and a type string nested thousands of
// levels deep one that no JSON encoder takes.
const (
	maxSchemaDepth = 32
	maxSchemaNodes = 10_000
)

// checkSchemaSize reports a schema deeper or larger than the bounds; it
// stops walking at the first excess, so it costs at most maxSchemaNodes.
func checkSchemaSize(s *spec.Schema) error {
	nodes := 0
	var walk func(s *spec.Schema, depth int) error
	walk = func(s *spec.Schema, depth int) error {
		if nodes++; nodes > maxSchemaNodes {
			return fmt.Errorf("the schema has more than %d fields and types, named types repeated where used: the CRD would be too large", maxSchemaNodes)
		}
		if depth > maxSchemaDepth {
			return fmt.Errorf("the schema nests more than %d levels deep", maxSchemaDepth)
		}
		for _, k := range slices.Sorted(maps.Keys(s.Properties)) {
			p := s.Properties[k]
			if err := walk(&p, depth+1); err != nil {
				return err
			}
		}
		if s.Items != nil && s.Items.Schema != nil {
			if err := walk(s.Items.Schema, depth+1); err != nil {
				return err
			}
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			return walk(s.AdditionalProperties.Schema, depth+1)
		}
		return nil
	}
	return walk(s, 0)
}

// declareTypes reads the names of the named types.
func (c *schemaCompiler) declareTypes(n *yaml.Node) {
	c.fieldsOf(n, c.typesField, func(k *yaml.Node, name string, v *yaml.Node) {
		if _, scalar := scalarTypes[name]; scalar || name == "object" || !typeName.MatchString(name) {
			c.d.errorf(k, JoinField(c.typesField, name), "%q cannot name a type: a name is letters and digits, starting with a letter, and not a built-in type", name)
			return
		}
		c.types[name] = v
	})
}

var typeName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*$`)

// fieldsOf calls f for each key of mapping n (a field name, once each).
func (c *schemaCompiler) fieldsOf(n *yaml.Node, field string, f func(k *yaml.Node, name string, v *yaml.Node)) bool {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		c.d.errorf(n, field, "must be a mapping of fields to types, not %s", kindName(n))
		return false
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
		switch {
		case k.Kind != yaml.ScalarNode || k.Value == "":
			c.d.errorf(k, field, "field names must be non-empty strings")
			continue
		case seen[k.Value]:
			c.d.errorf(k, JoinField(field, k.Value), "field given twice")
			continue
		}
		seen[k.Value] = true
		f(k, k.Value, n.Content[i+1])
	}
	return true
}

// object compiles a mapping of fields into an object schema.
func (c *schemaCompiler) object(n *yaml.Node, field string) *spec.Schema {
	s := &spec.Schema{}
	s.Type = spec.StringOrArray{"object"}
	s.Properties = map[string]spec.Schema{}
	ok := c.fieldsOf(n, field, func(_ *yaml.Node, name string, v *yaml.Node) {
		fs, required := c.field(v, JoinField(field, name))
		if fs == nil {
			return
		}
		s.Properties[name] = *fs
		if required {
			s.Required = append(s.Required, name)
		}
	})
	if !ok {
		return nil
	}
	if def := fieldDefaults(s); def != nil {
		s.Default = def
	}
	return s
}

// fieldDefaults is the default of object s with no required field whose
// fields have defaults: those defaults (each complete, its own fields'
// defaults in it), so that an object written without s gets its fields'
// defaults, as kro gives such an object (its default {} is defaulted by
// the API server all the same). The API server checks a default as it
// is, against s's validations: {} would fail one that reads a field. nil
// when s has a required field (no default fits every object) or no
// field with a default.
func fieldDefaults(s *spec.Schema) map[string]any {
	if len(s.Required) > 0 {
		return nil
	}
	var def map[string]any
	for name, p := range s.Properties {
		if p.Default == nil {
			continue
		}
		if def == nil {
			def = map[string]any{}
		}
		def[name] = p.Default
	}
	return def
}

// field compiles one field's type: a mapping (a nested object) or a
// string, its type and markers. required says whether a marker made it
// required.
func (c *schemaCompiler) field(v *yaml.Node, field string) (*spec.Schema, bool) {
	v = resolve(v)
	switch {
	case v.Kind == yaml.MappingNode:
		return c.object(v, field), false
	case v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str":
		typ, markers, hasMarkers := strings.Cut(v.Value, "|")
		off := len(typ) - len(strings.TrimLeft(typ, " \t"))
		s := c.typeOf(v, field, strings.TrimSpace(typ), off, 0)
		typeRequired := c.requiredTypes[strings.TrimSpace(typ)]
		if s == nil || !hasMarkers {
			return s, typeRequired
		}
		s, required := c.markers(v, field, s, markers, len(typ)+1)
		return s, required || typeRequired
	}
	c.d.errorf(v, field, `must be a type such as "string | required=true", or a mapping of fields, not %s`, kindName(v))
	return nil, false
}

// typeOf compiles a type expression t, which starts at byte off of v's
// value, nested depth lists and maps deep.
func (c *schemaCompiler) typeOf(v *yaml.Node, field, t string, off, depth int) *spec.Schema {
	s := &spec.Schema{}
	switch {
	case depth > maxSchemaDepth:
		c.d.errorAt(c.d.offsetPos(v, off), field, "the type nests more than %d lists and maps deep", maxSchemaDepth)
		return nil
	case t == "":
		c.d.errorAt(c.d.offsetPos(v, off), field, "the type is missing (string, integer, boolean, number, object, []T, map[string]T or a named type)")
		return nil
	case scalarTypes[t] != "":
		s.Type = spec.StringOrArray{scalarTypes[t]}
	case t == "object":
		s.Type = spec.StringOrArray{"object"}
		s.AddExtension("x-kubernetes-preserve-unknown-fields", true)
	case strings.HasPrefix(t, "[]"):
		items := c.typeOf(v, field, t[2:], off+2, depth+1)
		if items == nil {
			return nil
		}
		s.Type = spec.StringOrArray{"array"}
		s.Items = &spec.SchemaOrArray{Schema: items}
	case strings.HasPrefix(t, "map["):
		key, elem, ok := strings.Cut(t[len("map["):], "]")
		if !ok {
			c.d.errorAt(c.d.offsetPos(v, off), field, "%q: a map type is map[string]T", t)
			return nil
		}
		if key != "string" {
			c.d.errorAt(c.d.offsetPos(v, off+len("map[")), field, "map keys are strings in Kubernetes objects: map[string]T, not map[%s]", key)
			return nil
		}
		values := c.typeOf(v, field, elem, off+len("map[")+len(key)+1, depth+1)
		if values == nil {
			return nil
		}
		s.Type = spec.StringOrArray{"object"}
		s.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: values}
	case c.types[t] != nil:
		return c.named(t, v, off)
	default:
		c.d.errorAt(c.d.offsetPos(v, off), field, "unknown type %q: a type is string, integer, boolean, number, object, []T, map[string]T or one of %s", t, c.typeNames())
		return nil
	}
	return s
}

// typeNames lists the named types, for errors.
func (c *schemaCompiler) typeNames() string {
	if len(c.types) == 0 {
		return c.typesField + " (none declared)"
	}
	names := make([]string, 0, len(c.types))
	for n := range c.types {
		names = append(names, n)
	}
	slices.Sort(names)
	return c.typesField + " (" + strings.Join(names, ", ") + ")"
}

// named compiles named type name, referred to at byte off of v (nil: not
// referred to), and returns a copy of its schema; nil if it has errors or
// refers to itself.
func (c *schemaCompiler) named(name string, v *yaml.Node, off int) *spec.Schema {
	if s, ok := c.done[name]; ok {
		cp := *s
		return &cp
	}
	if c.failed[name] {
		return nil
	}
	if i := slices.Index(c.resolving, name); i >= 0 {
		cycle := strings.Join(append(slices.Clone(c.resolving[i:]), name), " → ")
		if v != nil {
			c.d.errorAt(c.d.offsetPos(v, off), JoinField(c.typesField, c.resolving[len(c.resolving)-1]), "type %q refers to itself (%s): a Kubernetes schema cannot be recursive", name, cycle)
		}
		c.failed[name] = true
		return nil
	}
	c.resolving = append(c.resolving, name)
	s, required := c.field(c.types[name], JoinField(c.typesField, name))
	c.resolving = c.resolving[:len(c.resolving)-1]
	c.requiredTypes[name] = required
	if s == nil {
		c.failed[name] = true
		return nil
	}
	c.done[name] = s
	cp := *s
	return &cp
}
