package expr

import (
	"encoding/base64"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
)

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
