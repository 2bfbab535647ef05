package expr

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
)

// ErrTooLarge is wrapped by the error of a render whose values would hold
// more than its Budget.
var ErrTooLarge = errors.New("too large")

// A Budget bounds the memory the values of one render hold once made Go
// values: what CEL reads of a trigger it reads in place, at almost no
// cost, but each child a template makes of it is a copy — a forEach over
// a trigger's list that copies a subtree of the trigger into every child
// made a 150 KB trigger take 2 GB. A nil Budget is no bound. It is not
// safe for concurrent use: one render, one goroutine.
type Budget struct {
	limit, left int64
}

// NewBudget is a Budget of bytes.
func NewBudget(bytes int64) *Budget { return &Budget{limit: bytes, left: bytes} }

// Spend takes n bytes from b: what values made outside CEL will hold —
// a function's answer, decoded. It fails, wrapping ErrTooLarge, once b
// has less than n left; a failed Spend leaves b spent.
func (b *Budget) Spend(n int64) error {
	if b == nil {
		return nil
	}
	if b.left -= n; b.left < 0 {
		return fmt.Errorf("%w: the values rendered for one trigger would hold more than %d MiB", ErrTooLarge, b.limit>>20)
	}
	return nil
}

// spend is Spend for what CEL makes, saying what usually makes too much.
func (b *Budget) spend(n int64) error {
	if err := b.Spend(n); err != nil {
		return fmt.Errorf("%w (an expression or forEach that copies the trigger's content many times multiplies it)", err)
	}
	return nil
}

// Shape counts what a JSON value holds once decoded into Go values: its
// values (each boxed in an interface), maps and their entries, lists and
// their elements, and the bytes of its strings and keys.
type Shape struct {
	Values, Maps, Entries, Lists, Elems, Bytes int64
}

// Size is what values of shape s hold, as a Budget counts them — as
// toNative would spend for the same values.
func (s Shape) Size() int64 {
	return s.Values*valueCost + s.Maps*mapCost + s.Entries*entryCost + s.Lists*listCost + s.Elems*elemCost + s.Bytes
}

func (s Shape) String() string {
	return fmt.Sprintf("%d values: %d maps of %d entries, %d lists of %d elements, %d bytes of strings", s.Values, s.Maps, s.Entries, s.Lists, s.Elems, s.Bytes)
}

// What a materialised value holds, as the budget counts it: the heap a
// map[string]any or []any and their entries take, strings by their
// length, scalars boxed in an interface.
const (
	mapCost   = 48
	entryCost = 32
	listCost  = 24
	elemCost  = 16
	valueCost = 16
)

// toNative converts a CEL value into the JSON-compatible Go values that
// unstructured Kubernetes objects hold, spending what they hold from b.
// Bytes become base64 strings (as in Secret data), timestamps RFC 3339
// strings, durations Go duration strings; an optional becomes its value or
// nil.
func toNative(v ref.Val, b *Budget) (any, error) {
	if s, ok := v.(types.String); ok {
		return string(s), b.spend(int64(len(s)) + valueCost)
	}
	if err := b.spend(valueCost); err != nil {
		return nil, err
	}
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
		return toNative(o.GetValue(), b)
	}
	switch v := v.(type) {
	case traits.Mapper:
		return mapToNative(v, b)
	case traits.Lister:
		return listToNative(v, b)
	}
	return nil, fmt.Errorf("a %s value cannot be part of an object", v.Type())
}

// costOf is what a container of n parts costs: base and each a part,
// saturating at the largest int64 (which no budget holds) so that a list
// of 2^60 elements built of shared parts is too large, not a wrapped sum.
func costOf(base int64, n int, each int64) int64 {
	if n < 0 || int64(n) > (math.MaxInt64-base)/each {
		return math.MaxInt64
	}
	return base + int64(n)*each
}

// mapToNative is toNative of a map: its keys must be strings.
func mapToNative(m traits.Mapper, b *Budget) (map[string]any, error) {
	n := int(m.Size().(types.Int))
	if err := b.spend(costOf(mapCost, n, entryCost)); err != nil {
		return nil, err
	}
	out := make(map[string]any, n)
	for it := m.Iterator(); it.HasNext() == types.True; {
		k := it.Next()
		ks, ok := k.(types.String)
		if !ok {
			return nil, fmt.Errorf("map key %v is a %s, want string", k, k.Type())
		}
		if err := b.spend(int64(len(ks))); err != nil {
			return nil, err
		}
		e, err := toNative(m.Get(k), b)
		if err != nil {
			return nil, fmt.Errorf("[%q]: %w", string(ks), err)
		}
		out[string(ks)] = e
	}
	return out, nil
}

// listToNative is toNative of a list.
func listToNative(l traits.Lister, b *Budget) ([]any, error) {
	n := int(l.Size().(types.Int))
	if err := b.spend(costOf(listCost, n, elemCost)); err != nil {
		return nil, err
	}
	out := make([]any, 0, n)
	for i := range n {
		e, err := toNative(l.Get(types.Int(i)), b)
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, e)
	}
	return out, nil
}
