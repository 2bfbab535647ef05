package rules

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// The markers of the API schema language: what follows a field's type
// after "|", as kro writes them — each a key=value that constrains,
// defaults or documents the field — and the values they take.

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

// markerOrder is the order markers apply in: the default last, checked
// against the others.
var markerOrder = []string{"required", "description", "immutable", "validation", "enum", "minimum", "maximum",
	"minLength", "maxLength", "pattern", "minItems", "maxItems", "uniqueItems", "listType", "listMapKey", "default"}

// repeatable are the markers a field may give more than once: each adds
// a rule, or a key of a composite key.
var repeatable = map[string]bool{"validation": true, "listMapKey": true}

// markers applies the markers of src (at byte base of v's value) to s,
// and reports whether one made the field required.
func (c *schemaCompiler) markers(v *yaml.Node, field string, s *spec.Schema, src string, base int) (*spec.Schema, bool) {
	ms, ok := c.parseMarkers(v, field, src, base)
	if !ok {
		return nil, false
	}
	byKey := map[string][]marker{}
	for _, m := range ms {
		switch {
		case !slices.Contains(schemaMarkers, m.key):
			c.d.errorAt(c.d.offsetPos(v, m.keyOff), field, "unknown marker %q (markers: %s)", m.key, strings.Join(schemaMarkers, ", "))
			return nil, false
		case len(byKey[m.key]) > 0 && !repeatable[m.key]:
			c.d.errorAt(c.d.offsetPos(v, m.keyOff), field, "marker %s given twice", m.key)
			return nil, false
		}
		byKey[m.key] = append(byKey[m.key], m)
	}
	failed := func(m marker, format string, args ...any) {
		c.d.errorAt(c.d.offsetPos(v, m.valueOff), field, "marker %s: "+format, append([]any{m.key}, args...)...)
	}
	required := false
	for _, key := range markerOrder {
		for _, m := range byKey[key] {
			var err error
			switch key {
			case "required":
				required, err = boolMarker(m.value)
			case "description":
				s.Description = m.value
			case "immutable":
				var on bool
				if on, err = boolMarker(m.value); on {
					addValidation(s, "self == oldSelf", "is immutable")
				}
			case "validation":
				if strings.TrimSpace(m.value) == "" {
					err = fmt.Errorf("the rule is empty: a CEL expression of self, such as validation=\"self.size() > 0\"")
				} else {
					addValidation(s, m.value, "")
				}
			default:
				err = constrain(s, key, m.value)
			}
			if err != nil {
				failed(m, "%v", err)
				return nil, false
			}
		}
	}
	if m, err := markersAgree(s, byKey); err != nil {
		failed(m, "%v", err)
		return nil, false
	}
	return s, required
}

// boolMarker reads a marker's true or false.
func boolMarker(value string) (bool, error) {
	v, err := scalarValue("boolean", value)
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// markersAgree checks what markers say together — bounds in order, a
// list's type and keys consistent — and returns the marker that does not
// agree with the others.
func markersAgree(s *spec.Schema, byKey map[string][]marker) (marker, error) {
	first := func(key string) marker {
		if ms := byKey[key]; len(ms) > 0 {
			return ms[0]
		}
		return marker{}
	}
	switch {
	case s.Minimum != nil && s.Maximum != nil && *s.Minimum > *s.Maximum:
		return first("maximum"), fmt.Errorf("%s is less than the minimum %s", first("maximum").value, first("minimum").value)
	case s.MinLength != nil && s.MaxLength != nil && *s.MinLength > *s.MaxLength:
		return first("maxLength"), fmt.Errorf("%s is less than minLength %s", first("maxLength").value, first("minLength").value)
	case s.MinItems != nil && s.MaxItems != nil && *s.MinItems > *s.MaxItems:
		return first("maxItems"), fmt.Errorf("%s is less than minItems %s", first("maxItems").value, first("minItems").value)
	}
	listType, _ := s.Extensions["x-kubernetes-list-type"].(string)
	keys := byKey["listMapKey"]
	switch {
	case len(keys) > 0 && listType != "map":
		return keys[0], fmt.Errorf("keys are for a list of listType=map, which this is not")
	case listType == "map" && len(keys) == 0:
		return first("listType"), fmt.Errorf("a list of listType=map names the items' key with listMapKey=<field> (one or more)")
	}
	var names []any
	for _, k := range keys {
		if err := mapKeyField(s.Items.Schema, k.value); err != nil {
			return k, err
		}
		if slices.Contains(names, any(k.value)) {
			return k, fmt.Errorf("%q is a key already", k.value)
		}
		names = append(names, k.value)
	}
	if len(names) > 0 {
		setExtension(s, "x-kubernetes-list-map-keys", names)
	}
	return marker{}, nil
}

// mapKeyField checks that field of the items (an object) can key a list
// of listType=map, as the API server requires: a string, integer or
// boolean field every item has, required or defaulted.
func mapKeyField(items *spec.Schema, field string) error {
	fs, ok := items.Properties[field]
	switch {
	case !ok:
		return fmt.Errorf("the items have no field %q", field)
	case len(fs.Type) != 1 || (fs.Type[0] != "string" && fs.Type[0] != "integer" && fs.Type[0] != "number" && fs.Type[0] != "boolean"):
		return fmt.Errorf("the key %q is %s; a key is a string, number or boolean", field, describeType(&fs))
	case fs.Default == nil && !slices.Contains(items.Required, field):
		return fmt.Errorf("the key %q is neither required nor defaulted: every item must have it (mark it required=true or give it a default)", field)
	}
	return nil
}

// addValidation adds a CEL rule (x-kubernetes-validations) to s, without
// changing the extensions s may share with a named type; without a
// message the API server says "failed rule: <rule>".
func addValidation(s *spec.Schema, rule, message string) {
	v := map[string]any{"rule": rule}
	if message != "" {
		v["message"] = message
	}
	rules, _ := s.Extensions["x-kubernetes-validations"].([]any)
	setExtension(s, "x-kubernetes-validations", append(slices.Clone(rules), v))
}

// setExtension sets an extension of s in a copy of its extensions, which
// s may share with a named type.
func setExtension(s *spec.Schema, key string, value any) {
	ext := make(spec.Extensions, len(s.Extensions)+1)
	for k, v := range s.Extensions {
		ext[k] = v
	}
	ext[key] = value
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
	case "minItems", "maxItems", "uniqueItems", "listType":
		return constrainList(s, key, value)
	case "default":
		v, err := defaultValue(s, value)
		if err != nil {
			return err
		}
		s.Default = v
	}
	return nil
}

// constrainList applies a list's marker to s.
func constrainList(s *spec.Schema, key, value string) error {
	switch key {
	case "minItems", "maxItems":
		if s.Type[0] != "array" {
			return fmt.Errorf("only lists take a %s, this is %s", key, describeType(s))
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%q is not a count (an integer, 0 or more)", value)
		}
		if key == "minItems" {
			s.MinItems = &n
		} else {
			s.MaxItems = &n
		}
	case "uniqueItems":
		unique, err := boolMarker(value)
		if err != nil || !unique {
			return err
		}
		// The API server takes no uniqueItems: a set is its unique list.
		return listType(s, "set")
	case "listType":
		return listType(s, value)
	}
	return nil
}

// listType makes s a list of type t — atomic (replaced whole by each
// writer), set (unique scalars, each owned on its own) or map (objects
// keyed by listMapKey fields) — as the API server's
// x-kubernetes-list-type.
func listType(s *spec.Schema, t string) error {
	if s.Type[0] != "array" {
		return fmt.Errorf("only lists take a listType, this is %s", describeType(s))
	}
	if had, _ := s.Extensions["x-kubernetes-list-type"].(string); had != "" && had != t {
		return fmt.Errorf("listType=%s contradicts uniqueItems=true (listType=set)", t)
	}
	items := s.Items.Schema
	switch t {
	case "atomic":
	case "set":
		if it := items.Type[0]; it != "string" && it != "integer" && it != "number" && it != "boolean" {
			return fmt.Errorf("only a list of strings, numbers or booleans is a set, this is a list of %s: a list of objects is keyed with listType=map listMapKey=<field>", strings.TrimPrefix(strings.TrimPrefix(describeType(items), "a "), "an "))
		}
	case "map":
		if items.Type[0] != "object" || items.AdditionalProperties != nil || len(items.Properties) == 0 {
			return fmt.Errorf("only a list of objects with fields is a map, this is a list of %s", strings.TrimPrefix(strings.TrimPrefix(describeType(items), "a "), "an "))
		}
	default:
		return fmt.Errorf("%q is not a list type: atomic, set or map", t)
	}
	setExtension(s, "x-kubernetes-list-type", t)
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
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				return at("the required field %q is missing", r)
			}
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
		if (s.MinItems != nil && int64(len(l)) < *s.MinItems) || (s.MaxItems != nil && int64(len(l)) > *s.MaxItems) {
			return at("%d items is not a number of items allowed", len(l))
		}
		if dup := duplicateItem(s, l); dup != "" {
			return at("%s is in the list twice", dup)
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

// duplicateItem is an item of l that a list of listType set or map holds
// twice (for a map, its key), as JSON; "" when none is.
func duplicateItem(s *spec.Schema, l []any) string {
	listType, _ := s.Extensions["x-kubernetes-list-type"].(string)
	keys, _ := s.Extensions["x-kubernetes-list-map-keys"].([]any)
	seen := map[string]bool{}
	for _, e := range l {
		id := e
		if listType == "map" {
			m, _ := e.(map[string]any)
			k := map[string]any{}
			for _, name := range keys {
				k[name.(string)] = m[name.(string)]
			}
			id = k
		} else if listType != "set" {
			return ""
		}
		j := jsonOf(id)
		if seen[j] {
			return j
		}
		seen[j] = true
	}
	return ""
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
