package expr

import (
	"encoding/base64"
	"fmt"
	"math"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
)

// toNative converts a CEL value into the JSON-compatible Go values that
// unstructured Kubernetes objects hold. Bytes become base64 strings (as in
// Secret data), timestamps RFC 3339 strings, durations Go duration strings;
// an optional becomes its value or nil.
func toNative(v ref.Val) (any, error) {
	switch v.Type() {
	case types.NullType:
		return nil, nil
	case types.BoolType:
		return bool(v.(types.Bool)), nil
	case types.IntType:
		return int64(v.(types.Int)), nil
	case types.UintType:
		u := uint64(v.(types.Uint))
		if u > math.MaxInt64 {
			return nil, fmt.Errorf("uint %d does not fit a JSON integer", u)
		}
		return int64(u), nil
	case types.DoubleType:
		f := float64(v.(types.Double))
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%v is not a JSON number", f)
		}
		return f, nil
	case types.StringType:
		return string(v.(types.String)), nil
	case types.BytesType:
		return base64.StdEncoding.EncodeToString([]byte(v.(types.Bytes))), nil
	case types.TimestampType:
		return v.(types.Timestamp).Time.UTC().Format(time.RFC3339Nano), nil
	case types.DurationType:
		return v.(types.Duration).Duration.String(), nil
	case types.OptionalType:
		o := v.(*types.Optional)
		if !o.HasValue() {
			return nil, nil
		}
		return toNative(o.GetValue())
	}
	switch v := v.(type) {
	case traits.Mapper:
		m := v
		out := make(map[string]any, int(m.Size().(types.Int)))
		for it := m.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				return nil, fmt.Errorf("map key %v is a %s, want string", k, k.Type())
			}
			e, err := toNative(m.Get(k))
			if err != nil {
				return nil, fmt.Errorf("[%q]: %w", string(ks), err)
			}
			out[string(ks)] = e
		}
		return out, nil
	case traits.Lister:
		l := v
		n := int(l.Size().(types.Int))
		out := make([]any, 0, n)
		for i := range n {
			e, err := toNative(l.Get(types.Int(i)))
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out = append(out, e)
		}
		return out, nil
	}
	return nil, fmt.Errorf("a %s value cannot be part of an object", v.Type())
}
