package expr

import (
	"fmt"
	"sort"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Type is what CEL knows of a value from the OpenAPI schema of its kind, the
// way the API server types objects for ValidatingAdmissionPolicy and CRD
// validation rules: an object with properties is a struct whose fields are
// known (a misspelt field is a compile error); additionalProperties make a
// map; items a list; strings of format byte, date, date-time and duration
// are bytes, timestamps and durations; numbers are doubles. What no schema
// describes — x-kubernetes-preserve-unknown-fields, int-or-string, a
// property without a type — is dyn, as before types. A nil *Type is dyn.
//
// Types are built lazily, a field when an expression first reads it: the
// schema of a Deployment is large, and a rule reads a handful of its
// fields. A Type is safe for concurrent use.
type Type struct {
	kind     typeKind
	name     string // kObject: the struct's type name
	schema   *spec.Schema
	resource bool // a kind's root or an embedded resource: has apiVersion, kind, metadata

	once   sync.Once
	fields map[string]*Type // kObject; the properties, built on first use
	elem   *Type            // kMap, kList
	cel    *types.Type
}

type typeKind int8

const (
	kDyn typeKind = iota
	kObject
	kMap
	kList
	kString
	kBytes
	kTimestamp
	kDate
	kDuration
	kInt
	kDouble
	kBool
)

var (
	dynMap = cel.MapType(cel.StringType, cel.DynType)
	scalar = map[typeKind]*types.Type{
		kDyn: cel.DynType, kString: cel.StringType, kBytes: cel.BytesType, kTimestamp: cel.TimestampType,
		kDate: cel.TimestampType, kDuration: cel.DurationType, kInt: cel.IntType, kDouble: cel.DoubleType, kBool: cel.BoolType,
	}
)

// stringFormats are the string formats CEL reads as other types, as the
// API server does.
var stringFormats = map[string]typeKind{"byte": kBytes, "date": kDate, "date-time": kTimestamp, "duration": kDuration}

// TypeOf is the type of objects with schema s (the whole object, references
// resolved), named name in messages — "apps/v1.Deployment". nil s: dyn.
func TypeOf(name string, s *spec.Schema) *Type {
	if s == nil {
		return nil
	}
	return typeOf(name, s, true)
}

// ListOf is the type of a list of t.
func ListOf(t *Type) *Type {
	l := &Type{kind: kList, elem: t}
	l.cel = cel.ListType(t.CEL())
	return l
}

// Struct is a struct type of the given fields: the rule's lookups and
// children by id.
func Struct(name string, fields map[string]*Type) *Type {
	t := &Type{kind: kObject, name: name, fields: fields}
	t.once.Do(func() {})
	t.cel = types.NewObjectType(name)
	return t
}

func typeOf(name string, s *spec.Schema, resource bool) *Type {
	t := &Type{name: name, schema: s, resource: resource}
	switch {
	case flag(s, "x-kubernetes-int-or-string"):
		t.kind = kDyn
	case flag(s, "x-kubernetes-embedded-resource") && flag(s, "x-kubernetes-preserve-unknown-fields"):
		t.kind = kMap // an object of any kind
	case flag(s, "x-kubernetes-preserve-unknown-fields"):
		if typeName(s) == "object" {
			t.kind = kMap
		}
	default:
		switch typeName(s) {
		case "object", "":
			switch {
			case len(s.Properties) > 0 || resource:
				if !identifiers(s.Properties) {
					t.kind = kMap // fields CEL cannot name are read as map keys
					break
				}
				t.kind = kObject
			case s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
				t.kind = kMap
			case typeName(s) == "object":
				t.kind = kMap
			}
		case "array":
			t.kind = kList
		case "string":
			t.kind = kString
			if k, ok := stringFormats[s.Format]; ok {
				t.kind = k
			}
		case "integer":
			t.kind = kInt
		case "number":
			t.kind = kDouble
		case "boolean":
			t.kind = kBool
		}
	}
	switch t.kind {
	case kObject:
		t.cel = types.NewObjectType(name)
	case kMap:
		t.cel = cel.MapType(cel.StringType, t.Elem().CEL())
	case kList:
		t.cel = cel.ListType(t.Elem().CEL())
	default:
		t.cel = scalar[t.kind]
	}
	return t
}

func flag(s *spec.Schema, ext string) bool {
	v, ok := s.Extensions[ext].(bool)
	return ok && v
}

func typeName(s *spec.Schema) string {
	if len(s.Type) == 1 {
		return s.Type[0]
	}
	return ""
}

func identifiers(props map[string]spec.Schema) bool {
	for k := range props {
		if !celIdent(k) {
			return false
		}
	}
	return true
}

func celIdent(s string) bool {
	for i, r := range s {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9' {
			continue
		}
		return false
	}
	return s != ""
}

// CEL is the CEL type: dyn for a nil Type.
func (t *Type) CEL() *types.Type {
	if t == nil {
		return cel.DynType
	}
	return t.cel
}

// Elem is the type of a list's items or a map's values.
func (t *Type) Elem() *Type {
	if t == nil || (t.kind != kList && t.kind != kMap) {
		return nil
	}
	t.build()
	return t.elem
}

// Field is the type of an object's field; ok is false when the object has
// no such field.
func (t *Type) Field(name string) (f *Type, ok bool) {
	if t == nil || t.kind != kObject {
		return nil, false
	}
	t.build()
	f, ok = t.fields[name]
	return f, ok
}

// FieldNames are an object's fields, sorted.
func (t *Type) FieldNames() []string {
	if t == nil || t.kind != kObject {
		return nil
	}
	t.build()
	names := make([]string, 0, len(t.fields))
	for n := range t.fields {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (t *Type) build() {
	t.once.Do(func() {
		s := t.schema
		if s == nil {
			return
		}
		switch t.kind {
		case kObject:
			t.fields = make(map[string]*Type, len(s.Properties)+3)
			for name, p := range s.Properties {
				p := p
				t.fields[name] = typeOf(t.name+"."+name, &p, flag(&p, "x-kubernetes-embedded-resource"))
			}
			if t.resource {
				// Every object has these, whatever its schema says.
				for _, f := range []string{"apiVersion", "kind"} {
					if _, ok := t.fields[f]; !ok {
						t.fields[f] = &Type{kind: kString, cel: cel.StringType}
					}
				}
				if _, ok := t.fields["metadata"]; !ok || t.fields["metadata"].kind != kObject {
					t.fields["metadata"] = &Type{kind: kMap, cel: dynMap}
				}
			}
		case kMap:
			if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
				a := s.AdditionalProperties.Schema
				t.elem = typeOf(t.name+".@value", a, flag(a, "x-kubernetes-embedded-resource"))
			}
		case kList:
			if s.Items != nil && s.Items.Schema != nil {
				i := s.Items.Schema
				t.elem = typeOf(t.name+".@item", i, flag(i, "x-kubernetes-embedded-resource"))
			}
		}
	})
}

// KindType is TypeOf with one Type per schema: rules over the same kind
// share it, and what one rule's expressions built of it.
func (c *Compiler) KindType(name string, s *spec.Schema) *Type {
	if s == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.kinds[s]; ok {
		return t
	}
	t := TypeOf(name, s)
	c.kinds[s] = t
	return t
}

// Types are what one rule's names hold, from the schemas of their kinds.
// Set the fields, then use the Types in every Scope of the rule; they must
// not change after the first compile.
type Types struct {
	// Object is the trigger's type.
	Object *Type
	// Lookups are by lookup id: an object, or a list for a list lookup.
	Lookups map[string]*Type
	// Children are by resource id: an object, or a list for a forEach.
	Children map[string]*Type

	mu                sync.Mutex
	prov              *provider
	lookups, children *Type
	envs              map[envKey]*cel.Env
}

type envKey struct {
	item                    *Type
	dynChildren, dynLookups bool
}

// valueTypes are how a program converts the values of its activation.
type valueTypes struct {
	object, lookups, children, item, self *Type
}

func (s Scope) valueTypes() *valueTypes {
	vt := &valueTypes{item: s.Item, self: s.SelfType}
	if ts := s.Types; ts != nil {
		ts.mu.Lock()
		ts.structs()
		vt.object, vt.lookups, vt.children = ts.Object, ts.lookups, ts.children
		ts.mu.Unlock()
	}
	return vt
}

// structs makes the struct types of lookups and children, once. ts.mu is
// held.
func (ts *Types) structs() {
	if ts.lookups == nil {
		ts.lookups = Struct("lookups", ts.Lookups)
		ts.children = Struct("children", ts.Children)
	}
}

// env is the rule's environment: every name declared, typed (item as k
// says), whatever the scope — Compile rejects the names a scope does not
// have before the checker runs. One environment serves all of a rule's
// expressions but the forEach templates whose item is typed: environments
// are costly (each holds the checker's copy of every function).
func (ts *Types) env(c *Compiler, k envKey) (*cel.Env, *provider, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.prov == nil {
		ts.structs()
		ts.prov = newProvider(c.lib.CELTypeProvider(), ts.Object, ts.lookups, ts.children)
		ts.envs = map[envKey]*cel.Env{}
	}
	if e, ok := ts.envs[k]; ok {
		return e, ts.prov, nil
	}
	ts.prov.mu.Lock()
	ts.prov.register(k.item)
	ts.prov.mu.Unlock()
	lookups, children := ts.lookups.CEL(), ts.children.CEL()
	if k.dynLookups {
		lookups = dynMap
	}
	if k.dynChildren {
		children = dynMap
	}
	e, err := c.lib.Extend(
		cel.CustomTypeProvider(ts.prov),
		cel.Variable(varObject, or(ts.Object, dynMap)),
		cel.Variable(varLookups, lookups),
		cel.Variable(varVariables, dynMap),
		cel.Variable(varRule, cel.StringType),
		cel.Variable(varItem, k.item.CEL()),
		cel.Variable(varIndex, cel.IntType),
		cel.Variable(varChildren, children),
		cel.Variable(varReady, cel.MapType(cel.StringType, cel.BoolType)),
		cel.Variable(varCluster, dynMap),
		cel.Variable(varClusters, cel.ListType(dynMap)),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("building the rule's CEL environment: %w", err)
	}
	ts.envs[k] = e
	return e, ts.prov, nil
}

// selfEnv is the environment of readyWhen over children of type t: shared
// by every rule with children of t's kind.
func (c *Compiler) selfEnv(t *Type) (*cel.Env, *provider, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.selfEnvs[t]; ok {
		return e.env, e.prov, nil
	}
	prov := newProvider(c.lib.CELTypeProvider(), t)
	e, err := c.lib.Extend(cel.CustomTypeProvider(prov), cel.Variable(varSelf, or(t, dynMap)))
	if err != nil {
		return nil, nil, fmt.Errorf("building the readyWhen CEL environment: %w", err)
	}
	c.selfEnvs[t] = typedEnv{e, prov}
	return e, prov, nil
}

type typedEnv struct {
	env  *cel.Env
	prov *provider
}

// or is t's CEL type, or def when t is dyn.
func or(t *Type, def *types.Type) *types.Type {
	if t == nil {
		return def
	}
	return t.CEL()
}
