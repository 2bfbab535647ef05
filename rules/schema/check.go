package schema

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Kind is what a template value is known to be before it is rendered.
type Kind int

const (
	// Unknown: a ${} whose type is not known until it is evaluated.
	Unknown Kind = iota
	String
	Int
	Number
	Bool
	Map
	List
	Null
)

func (k Kind) String() string {
	return [...]string{"a value of unknown type", "a string", "an integer", "a number", "a bool", "a mapping", "a list", "null"}[k]
}

// Problem is a template value the schema does not allow. Path is where,
// from the template's root; Key says the problem is the map key at Path
// (an unknown field), whose siblings are Known.
type Problem struct {
	Path []any
	Key  bool
	// Warning: the API server may still accept it (a required field that
	// defaulting or admission may fill in).
	Warning bool
	Msg     string
	Field   string   // the unknown field, when Key
	Known   []string // the fields the schema has there, when Key
}

// KindOf describes a template string that holds ${}: a sole ${expr} is the
// expression's type (Unknown when dyn), text around ${} parts is a String.
type KindOf func(path []any, s string) Kind

// Check walks a template — maps, lists and scalars as decoded from YAML —
// against the schema of its kind and returns what the API server would
// reject or drop: fields the kind does not have, values of the wrong type;
// with required, also warnings for required fields a written mapping lacks
// (not for a patch, which completes an existing object). Templated map
// keys, and values whose type is not known until rendered, are not checked.
func Check(s *spec.Schema, v any, kindOf KindOf, required bool) []Problem {
	c := &checker{kindOf: kindOf, required: required}
	c.check(s, v, nil)
	return c.problems
}

type checker struct {
	kindOf   KindOf
	required bool
	problems []Problem
}

func (c *checker) add(path []any, format string, args ...any) {
	c.problems = append(c.problems, Problem{Path: append([]any(nil), path...), Msg: fmt.Sprintf(format, args...)})
}

func with(path []any, e any) []any { return append(append([]any(nil), path...), e) }

func (c *checker) check(s *spec.Schema, v any, path []any) {
	if s == nil {
		return
	}
	kind := c.kindOfValue(v, path)
	if kind == Null || kind == Unknown {
		return // null removes the field; an unknown type is checked when rendered
	}
	if intOrString(s) {
		if kind != Int && kind != String {
			c.add(path, "wants an integer or a string, the template gives %s", kind)
		}
		return
	}
	if alts := alternatives(s); alts != nil {
		// oneOf/anyOf of plain types (a Quantity: a string or a number).
		for _, t := range alts {
			if scalarFits(kind, v, t) {
				return
			}
		}
		c.add(path, "wants %s, the template gives %s", strings.Join(mapArticles(alts), " or "), kind)
		return
	}
	want := typeOf(s)
	switch kind {
	case Map:
		if want != "" && want != "object" {
			c.add(path, "wants %s, the template gives a mapping", article(want))
			return
		}
		m, ok := v.(map[string]any)
		if !ok {
			return // a ${} giving a map: its keys are not known
		}
		c.fields(s, m, path)
	case List:
		if want != "" && want != "array" {
			c.add(path, "wants %s, the template gives a list", article(want))
			return
		}
		l, ok := v.([]any)
		if !ok || s.Items == nil || s.Items.Schema == nil {
			return
		}
		for i, e := range l {
			c.check(s.Items.Schema, e, with(path, i))
		}
	default:
		if !scalarFits(kind, v, want) {
			c.add(path, "wants %s, the template gives %s", article(want), kind)
		}
	}
}

// fields checks the keys and values of a mapping against an object schema.
func (c *checker) fields(s *spec.Schema, m map[string]any, path []any) {
	open := preserveUnknown(s) || (len(s.Properties) == 0 && s.AdditionalProperties == nil)
	embedded := false
	if v, ok := s.Extensions["x-kubernetes-embedded-resource"].(bool); ok && v {
		embedded = true // apiVersion, kind and metadata go without saying
	}
	var extra *spec.Schema
	if s.AdditionalProperties != nil {
		if s.AdditionalProperties.Schema != nil {
			extra = s.AdditionalProperties.Schema
		} else if s.AdditionalProperties.Allows {
			open = true
		}
	}
	keys := make([]string, 0, len(m))
	templatedKey := false
	for k := range m {
		keys = append(keys, k)
		templatedKey = templatedKey || strings.Contains(k, "${")
	}
	sort.Strings(keys)
	if c.required && !templatedKey {
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				c.problems = append(c.problems, Problem{Path: append([]any(nil), path...), Warning: true,
					Msg: fmt.Sprintf("missing required field %q (unless defaulting or admission sets it)", r)})
			}
		}
	}
	for _, k := range keys {
		e := m[k]
		if p, ok := s.Properties[k]; ok {
			c.check(&p, e, with(path, k))
			continue
		}
		switch {
		case extra != nil:
			c.check(extra, e, with(path, k))
		case open, strings.Contains(k, "${"), embedded && (k == "apiVersion" || k == "kind" || k == "metadata"):
			// any field, a key known only when rendered, or an embedded
			// object's type and metadata
		default:
			known := make([]string, 0, len(s.Properties))
			for name := range s.Properties {
				known = append(known, name)
			}
			sort.Strings(known)
			c.problems = append(c.problems, Problem{Path: with(path, k), Key: true, Field: k, Known: known,
				Msg: fmt.Sprintf("unknown field %q", k)})
		}
	}
}

// kindOfValue says what a template value is.
func (c *checker) kindOfValue(v any, path []any) Kind {
	switch v := v.(type) {
	case nil:
		return Null
	case map[string]any:
		return Map
	case []any:
		return List
	case bool:
		return Bool
	case int, int64:
		return Int
	case float64:
		return Number
	case string:
		if strings.Contains(v, "${") && c.kindOf != nil {
			return c.kindOf(path, v)
		}
		return String
	}
	return Unknown
}

// scalarFits reports whether a scalar of kind k (literal value v, when
// known) may go where want is wanted.
func scalarFits(k Kind, v any, want string) bool {
	switch want {
	case "":
		return true
	case "string":
		return k == String
	case "integer":
		if k == Number {
			f, ok := v.(float64)
			return ok && f == math.Trunc(f) // 3.0 decodes as 3
		}
		return k == Int
	case "number":
		return k == Int || k == Number
	case "boolean":
		return k == Bool
	case "object":
		return k == Map
	case "array":
		return k == List
	}
	return true
}

func typeOf(s *spec.Schema) string {
	if len(s.Type) == 1 {
		return s.Type[0]
	}
	return ""
}

func article(t string) string {
	switch t {
	case "integer", "array", "object":
		return "an " + map[string]string{"integer": "integer", "array": "array (a list)", "object": "object (a mapping)"}[t]
	case "boolean":
		return "a bool"
	}
	return "a " + t
}

func intOrString(s *spec.Schema) bool {
	v, ok := s.Extensions["x-kubernetes-int-or-string"].(bool)
	return ok && v
}

// alternatives returns the types a schema without a type of its own
// allows through oneOf or anyOf, when each alternative is a plain type
// (built-in IntOrString: integer or string; Quantity: string or number);
// nil otherwise.
func alternatives(s *spec.Schema) []string {
	if typeOf(s) != "" {
		return nil
	}
	alts := s.OneOf
	if len(alts) == 0 {
		alts = s.AnyOf
	}
	if len(alts) == 0 {
		return nil
	}
	var out []string
	for i := range alts {
		t := typeOf(&alts[i])
		if t == "" || t == "object" || t == "array" {
			return nil
		}
		out = append(out, t)
	}
	return out
}

func mapArticles(ts []string) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = article(t)
	}
	return out
}

func preserveUnknown(s *spec.Schema) bool {
	v, ok := s.Extensions["x-kubernetes-preserve-unknown-fields"].(bool)
	return ok && v
}
