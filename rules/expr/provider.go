package expr

import (
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
)

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
