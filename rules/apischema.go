package rules

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
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
var schemaMarkers = []string{"required", "default", "description", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern", "immutable"}

// schemaCompiler compiles one kind's simple schema.
type schemaCompiler struct {
	d          *decoder
	types      map[string]*yaml.Node // named types, by name
	typesField string                // where they are declared, for errors
	done       map[string]*spec.Schema
	failed     map[string]bool
	resolving  []string // named types being compiled: a cycle is an error
}

// compileAPISchema compiles the simple schema of a kind's spec (specNode,
// at specField) with the named types of typesNode (nil: none) into an
// OpenAPI v3 schema; nil when it has errors (reported to d). Every named
// type is compiled, used or not, so that its mistakes are found.
func (d *decoder) compileAPISchema(specNode *yaml.Node, specField string, typesNode *yaml.Node, typesField string) *spec.Schema {
	c := &schemaCompiler{d: d, types: map[string]*yaml.Node{}, typesField: typesField,
		done: map[string]*spec.Schema{}, failed: map[string]bool{}}
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
	return s
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
		if s == nil || !hasMarkers {
			return s, false
		}
		return c.markers(v, field, s, markers, len(typ)+1)
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
	if required {
		c.d.errorf(resolve(c.types[name]), JoinField(c.typesField, name), "a named type cannot be required: mark the fields of its type required=true")
		s = nil
	}
	if s == nil {
		c.failed[name] = true
		return nil
	}
	c.done[name] = s
	cp := *s
	return &cp
}

// marker is one key=value of a field's type, and where its value is.
type marker struct {
	key, value string
	keyOff     int // byte offsets in the field's string
	valueOff   int
}

// parseMarkers splits src, at byte base of v's value, into markers:
// key=value separated by spaces, a value in double quotes when it holds
// spaces (\" and \\ escape inside).
func (c *schemaCompiler) parseMarkers(v *yaml.Node, field, src string, base int) ([]marker, bool) {
	var out []marker
	for i := 0; i < len(src); {
		if src[i] == ' ' || src[i] == '\t' {
			i++
			continue
		}
		m := marker{keyOff: base + i}
		eq := strings.IndexByte(src[i:], '=')
		sp := strings.IndexAny(src[i:], " \t")
		if eq < 0 || (sp >= 0 && sp < eq) {
			end := len(src)
			if sp >= 0 {
				end = i + sp
			}
			c.d.errorAt(c.d.offsetPos(v, m.keyOff), field, "marker %q has no value: markers are key=value (%s)", src[i:end], strings.Join(schemaMarkers, ", "))
			return nil, false
		}
		m.key = src[i : i+eq]
		i += eq + 1
		m.valueOff = base + i
		if i < len(src) && src[i] == '"' {
			val, n, ok := unquoteMarker(src[i:])
			if !ok {
				c.d.errorAt(c.d.offsetPos(v, m.valueOff), field, "marker %s: the quoted value does not end", m.key)
				return nil, false
			}
			m.value, i = val, i+n
		} else {
			end := strings.IndexAny(src[i:], " \t")
			if end < 0 {
				end = len(src) - i
			}
			m.value, i = src[i:i+end], i+end
		}
		out = append(out, m)
	}
	return out, true
}

// unquoteMarker reads a double-quoted value at the start of s and returns
// it and how many bytes it took.
func unquoteMarker(s string) (string, int, bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		case '"':
			return b.String(), i + 1, true
		default:
			b.WriteByte(s[i])
		}
	}
	return "", 0, false
}

// markers applies the markers of src (at byte base of v's value) to s,
// and reports whether one made the field required.
func (c *schemaCompiler) markers(v *yaml.Node, field string, s *spec.Schema, src string, base int) (*spec.Schema, bool) {
	ms, ok := c.parseMarkers(v, field, src, base)
	if !ok {
		return nil, false
	}
	byKey := map[string]marker{}
	for _, m := range ms {
		switch {
		case !slices.Contains(schemaMarkers, m.key):
			c.d.errorAt(c.d.offsetPos(v, m.keyOff), field, "unknown marker %q (markers: %s)", m.key, strings.Join(schemaMarkers, ", "))
			return nil, false
		case byKey[m.key].key != "":
			c.d.errorAt(c.d.offsetPos(v, m.keyOff), field, "marker %s given twice", m.key)
			return nil, false
		}
		byKey[m.key] = m
	}
	fail := func(m marker, format string, args ...any) (*spec.Schema, bool) {
		c.d.errorAt(c.d.offsetPos(v, m.valueOff), field, "marker %s: "+format, append([]any{m.key}, args...)...)
		return nil, false
	}
	required := false
	// In this order: the default is checked against the others.
	for _, key := range []string{"required", "description", "immutable", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern", "default"} {
		m, ok := byKey[key]
		if !ok {
			continue
		}
		var err error
		switch key {
		case "required":
			var v any
			v, err = scalarValue("boolean", m.value)
			required = err == nil && v.(bool)
		case "description":
			s.Description = m.value
		case "immutable":
			var v any
			if v, err = scalarValue("boolean", m.value); err == nil && v.(bool) {
				addValidation(s, "self == oldSelf", "is immutable")
			}
		default:
			err = constrain(s, key, m.value)
		}
		if err != nil {
			return fail(m, "%v", err)
		}
	}
	if lo, hi := byKey["minimum"], byKey["maximum"]; s.Minimum != nil && s.Maximum != nil && *s.Minimum > *s.Maximum {
		return fail(hi, "%s is less than the minimum %s", hi.value, lo.value)
	}
	if lo, hi := byKey["minLength"], byKey["maxLength"]; s.MinLength != nil && s.MaxLength != nil && *s.MinLength > *s.MaxLength {
		return fail(hi, "%s is less than minLength %s", hi.value, lo.value)
	}
	return s, required
}

// addValidation adds a CEL rule (x-kubernetes-validations) to s, without
// changing the extensions s may share with a named type.
func addValidation(s *spec.Schema, rule, message string) {
	ext := spec.Extensions{}
	for k, v := range s.Extensions {
		ext[k] = v
	}
	rules, _ := ext["x-kubernetes-validations"].([]any)
	ext["x-kubernetes-validations"] = append(slices.Clone(rules), map[string]any{"rule": rule, "message": message})
	s.Extensions = ext
}

// constrain applies one value marker (enum, a bound, a pattern, default)
// to s, checking it fits s's type.
func constrain(s *spec.Schema, key, value string) error {
	typ := s.Type[0]
	numeric := typ == "integer" || typ == "number"
	switch key {
	case "enum":
		if typ != "string" && !numeric {
			return fmt.Errorf("only strings and numbers take an enum, this is %s", describeType(s))
		}
		for _, e := range strings.Split(value, ",") {
			v, err := scalarValue(typ, strings.TrimSpace(e))
			if err != nil {
				return err
			}
			if slices.Contains(s.Enum, v) {
				return fmt.Errorf("%v is listed twice", v)
			}
			s.Enum = append(s.Enum, v)
		}
	case "minimum", "maximum":
		if !numeric {
			return fmt.Errorf("only numbers take a %s, this is %s", key, describeType(s))
		}
		v, err := scalarValue(typ, value)
		if err != nil {
			return err
		}
		f := toFloat(v)
		if key == "minimum" {
			s.Minimum = &f
		} else {
			s.Maximum = &f
		}
	case "minLength", "maxLength":
		if typ != "string" {
			return fmt.Errorf("only strings take a %s, this is %s", key, describeType(s))
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a length (an integer, 0 or more)", value)
		}
		if key == "minLength" {
			s.MinLength = &n
		} else {
			s.MaxLength = &n
		}
	case "pattern":
		if typ != "string" {
			return fmt.Errorf("only strings take a pattern, this is %s", describeType(s))
		}
		if _, err := regexp.Compile(value); err != nil {
			return fmt.Errorf("%q is not a regular expression: %v", value, err)
		}
		s.Pattern = value
	case "default":
		v, err := defaultValue(s, value)
		if err != nil {
			return err
		}
		s.Default = v
	}
	return nil
}

// scalarValue parses a marker's value as a value of scalar type typ.
func scalarValue(typ, value string) (any, error) {
	switch typ {
	case "string":
		return value, nil
	case "integer":
		v, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not an integer", value)
		}
		return v, nil
	case "number":
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", value)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			// ParseFloat reads NaN, Inf and Infinity; JSON, and so a
			// CRD, cannot hold them.
			return nil, fmt.Errorf("%q is not a finite number", value)
		}
		return v, nil
	case "boolean":
		v, err := strconv.ParseBool(value)
		if err != nil {
			return nil, fmt.Errorf("%q is not true or false", value)
		}
		return v, nil
	}
	return nil, fmt.Errorf("internal: %s is not a scalar type", typ)
}

// defaultValue parses a default for s: a scalar as its type reads it, an
// array, map or object in JSON; it must fit s's type and constraints.
func defaultValue(s *spec.Schema, value string) (any, error) {
	var v any
	if typ := s.Type[0]; typ == "array" || typ == "object" {
		if err := json.Unmarshal([]byte(value), &v); err != nil {
			return nil, fmt.Errorf("the default of %s is JSON: %q is not", describeType(s), value)
		}
	} else {
		var err error
		if v, err = scalarValue(typ, value); err != nil {
			return nil, err
		}
	}
	if err := conforms(s, v, ""); err != nil {
		return nil, fmt.Errorf("default %s: %v", value, err)
	}
	return v, nil
}

// conforms reports why v does not fit s (at path, for the message).
func conforms(s *spec.Schema, v any, path string) error {
	at := func(format string, args ...any) error {
		if path != "" {
			format = path + ": " + format
		}
		return fmt.Errorf(format, args...)
	}
	switch typ := s.Type[0]; typ {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return at("want an object, not %s", jsonKind(v))
		}
		for k, e := range m {
			fs, known := s.Properties[k]
			switch {
			case known:
			case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
				fs = *s.AdditionalProperties.Schema
			case s.Extensions["x-kubernetes-preserve-unknown-fields"] == true:
				continue
			default:
				return at("unknown field %q", k)
			}
			if err := conforms(&fs, e, JoinField(path, k)); err != nil {
				return err
			}
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			return at("want a list, not %s", jsonKind(v))
		}
		for i, e := range l {
			if err := conforms(s.Items.Schema, e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		return conformsScalar(s, typ, v, at)
	}
	return nil
}

// conformsScalar is conforms for a string, number or boolean.
func conformsScalar(s *spec.Schema, typ string, v any, at func(string, ...any) error) error {
	switch x := v.(type) {
	case string:
		if typ != "string" {
			return at("want %s, not a string", typ)
		}
		if (s.MinLength != nil && int64(len(x)) < *s.MinLength) || (s.MaxLength != nil && int64(len(x)) > *s.MaxLength) {
			return at("%q is not of the length allowed", x)
		}
		if s.Pattern != "" && !regexp.MustCompile(s.Pattern).MatchString(x) {
			return at("%q does not match the pattern %q", x, s.Pattern)
		}
	case bool:
		if typ != "boolean" {
			return at("want %s, not a boolean", typ)
		}
	case int64, float64:
		f := toFloat(x)
		switch {
		case typ == "integer" && f != float64(int64(f)):
			return at("want an integer, not %v", x)
		case typ != "integer" && typ != "number":
			return at("want %s, not a number", typ)
		case s.Minimum != nil && f < *s.Minimum, s.Maximum != nil && f > *s.Maximum:
			return at("%v is out of the range allowed", x)
		}
	default:
		return at("want %s, not %s", typ, jsonKind(v))
	}
	if len(s.Enum) > 0 && !slices.ContainsFunc(s.Enum, func(e any) bool { return fmt.Sprint(e) == fmt.Sprint(v) }) {
		return at("%v is not one of the enum (%v)", v, s.Enum)
	}
	return nil
}

func toFloat(v any) float64 {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case float64:
		return x
	}
	return 0
}

// describeType names s's type for messages.
func describeType(s *spec.Schema) string {
	switch {
	case s.Type[0] == "array":
		return "a list"
	case s.AdditionalProperties != nil:
		return "a map"
	case s.Type[0] == "object":
		return "an object"
	}
	return "a " + s.Type[0]
}

// jsonKind names the JSON kind of v for messages.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	}
	return "a number"
}
