package expr

import (
	"encoding/base64"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
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

// provider is the type provider of a rule's environment: it answers the
// checker's questions about the rule's struct types from their schemas, and
// remembers every struct type it handed out, so that one named in a checked
// expression (a forEach's items) can be found again.
type provider struct {
	types.Provider
	mu      sync.Mutex
	structs map[string]*Type
	// missed is the last field an expression read that its struct does not
	// have: the checker says "undefined field", the compiler adds what the
	// struct has.
	missed struct {
		t     *Type
		field string
	}
}

func newProvider(base types.Provider, roots ...*Type) *provider {
	p := &provider{Provider: base, structs: map[string]*Type{}}
	for _, r := range roots {
		p.register(r)
	}
	return p
}

// register makes t, and the struct types it is made of that are already
// built, known by name.
func (p *provider) register(t *Type) {
	for t != nil {
		switch t.kind {
		case kObject:
			p.structs[t.name] = t
			return
		case kList, kMap:
			t = t.Elem()
		default:
			return
		}
	}
}

func (p *provider) lookup(name string) (*Type, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.structs[name]
	return t, ok
}

// FindStructType implements types.Provider.
func (p *provider) FindStructType(name string) (*types.Type, bool) {
	if t, ok := p.lookup(name); ok {
		return types.NewTypeTypeWithParam(t.cel), true
	}
	return p.Provider.FindStructType(name)
}

// FindStructFieldNames implements types.Provider.
func (p *provider) FindStructFieldNames(name string) ([]string, bool) {
	if t, ok := p.lookup(name); ok {
		return t.FieldNames(), true
	}
	return p.Provider.FindStructFieldNames(name)
}

// FindStructFieldType implements types.Provider.
func (p *provider) FindStructFieldType(name, field string) (*types.FieldType, bool) {
	t, ok := p.lookup(name)
	if !ok {
		return p.Provider.FindStructFieldType(name, field)
	}
	f, ok := t.Field(field)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !ok {
		p.missed.t, p.missed.field = t, field
		return nil, false
	}
	p.register(f)
	return &types.FieldType{Type: f.CEL()}, true
}

// fromCEL finds the Type of a checked expression's type: the struct types
// this provider handed out, lists and maps of them, and the scalars that
// are converted from JSON (timestamps, bytes, durations, doubles).
func (p *provider) fromCEL(t *types.Type) *Type {
	switch t.Kind() {
	case types.StructKind:
		st, _ := p.lookup(t.TypeName())
		return st
	case types.ListKind:
		if e := p.fromCEL(t.Parameters()[0]); e != nil {
			return ListOf(e)
		}
	case types.MapKind:
		if e := p.fromCEL(t.Parameters()[1]); e != nil {
			m := &Type{kind: kMap, elem: e, cel: t}
			m.once.Do(func() {})
			return m
		}
	case types.TimestampKind:
		return &Type{kind: kTimestamp, cel: cel.TimestampType}
	case types.BytesKind:
		return &Type{kind: kBytes, cel: cel.BytesType}
	case types.DurationKind:
		return &Type{kind: kDuration, cel: cel.DurationType}
	case types.DoubleKind:
		return &Type{kind: kDouble, cel: cel.DoubleType}
	}
	return nil
}

// Value is v, a JSON value as unstructured objects hold it, as CEL sees it
// under t: maps and lists are wrapped, converting what they hold when it
// is read; strings of the byte, date, date-time and duration formats become
// bytes, timestamps and durations; integers of a number field become
// doubles. A value that does not have the shape of its schema (a template
// rendered offline holds placeholders) is left as it is.
func (t *Type) Value(v any) ref.Val {
	if t == nil || v == nil {
		return types.DefaultTypeAdapter.NativeToValue(v)
	}
	if rv, ok := v.(ref.Val); ok {
		return rv
	}
	switch t.kind {
	case kObject:
		if m, ok := v.(map[string]any); ok {
			return &object{Mapper: types.NewStringInterfaceMap(types.DefaultTypeAdapter, m), m: m, t: t}
		}
	case kMap:
		if m, ok := v.(map[string]any); ok && t.Elem() != nil {
			return types.NewStringInterfaceMap(adapter{t.Elem()}, m)
		}
	case kList:
		if l, ok := v.([]any); ok && t.Elem() != nil {
			return types.NewDynamicList(adapter{t.Elem()}, l)
		}
	case kTimestamp:
		if s, ok := v.(string); ok {
			if d, err := strfmt.ParseDateTime(s); err == nil {
				return types.Timestamp{Time: time.Time(d)}
			}
		}
	case kDate:
		if s, ok := v.(string); ok {
			if d, err := time.Parse(strfmt.RFC3339FullDate, s); err == nil {
				return types.Timestamp{Time: d}
			}
		}
	case kDuration:
		if s, ok := v.(string); ok {
			if d, err := strfmt.ParseDuration(s); err == nil {
				return types.Duration{Duration: d}
			}
		}
	case kBytes:
		if s, ok := v.(string); ok {
			if b, err := base64.StdEncoding.DecodeString(s); err == nil {
				return types.Bytes(b)
			}
		}
	case kDouble:
		switch n := v.(type) {
		case int64:
			return types.Double(n)
		case int:
			return types.Double(n)
		}
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

// adapter converts the items of a list or the values of a map of one type.
type adapter struct{ t *Type }

func (a adapter) NativeToValue(v any) ref.Val { return a.t.Value(v) }

// object is a JSON object whose fields are converted by their types when
// read. Iteration, size and key tests are the map's.
type object struct {
	traits.Mapper
	m map[string]any
	t *Type
}

func (o *object) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		return o.Mapper.Find(key)
	}
	v, found := o.m[string(k)]
	if !found {
		return nil, false
	}
	f, _ := o.t.Field(string(k))
	return f.Value(v), true
}

func (o *object) Get(key ref.Val) ref.Val {
	if v, found := o.Find(key); found {
		return v
	}
	return types.ValOrErr(key, "no such key: %v", key)
}

func (o *object) Equal(other ref.Val) ref.Val {
	om, ok := other.(traits.Mapper)
	if !ok {
		return types.MaybeNoSuchOverloadErr(other)
	}
	if o.Size() != om.Size() {
		return types.False
	}
	for k := range o.m {
		ov, found := om.Find(types.String(k))
		if !found {
			return types.False
		}
		v, _ := o.Find(types.String(k))
		if eq := v.Equal(ov); eq != types.True {
			return eq
		}
	}
	return types.True
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
