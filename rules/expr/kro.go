package expr

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"slices"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/ext"
)

// kro's CEL functions beyond the Kubernetes libraries, so that a
// ResourceGraphDefinition's expressions port unchanged: cel.bind,
// random.seededString and seededInt (the same strings and numbers kro
// makes of a seed, so a port keeps the names and passwords kro made),
// hash.fnv64a, sha256 and md5, json.marshal and unmarshal,
// lists.setAtIndex, insertAtIndex and removeAtIndex, and map merge and
// deepMerge. Each is deterministic, and each is charged to the
// expression's cost limit by the work it does (callCosts): a call whose
// work would exceed the limit fails before it is made.

// seedAlphabet is what random.seededString draws from, as kro does: a
// string of it is a valid DNS label.
const seedAlphabet = "0123456789abcdefghijklmnopqrstuvwxyz"

func kroLibrary(limit uint64) []cel.EnvOption {
	list := cel.ListType(cel.TypeParamType("T"))
	mapKV := cel.MapType(cel.TypeParamType("K"), cel.TypeParamType("V"))
	hashOf := func(name string, sum func([]byte) []byte) cel.EnvOption {
		return cel.Function("hash."+name, cel.Overload("hash."+name+"_string", []*cel.Type{cel.StringType}, cel.BytesType,
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				s, ok := v.(types.String)
				if !ok {
					return types.MaybeNoSuchOverloadErr(v)
				}
				return types.Bytes(sum([]byte(s)))
			})))
	}
	return []cel.EnvOption{
		ext.Bindings(),
		cel.Function("random.seededString", cel.Overload("random.seededString_int_string", []*cel.Type{cel.IntType, cel.StringType}, cel.StringType,
			cel.BinaryBinding(seededString))),
		cel.Function("random.seededInt", cel.Overload("random.seededInt_int_int_string", []*cel.Type{cel.IntType, cel.IntType, cel.StringType}, cel.IntType,
			cel.FunctionBinding(seededInt))),
		hashOf("fnv64a", func(b []byte) []byte { h := fnv.New64a(); h.Write(b); return h.Sum(nil) }),
		hashOf("sha256", func(b []byte) []byte { s := sha256.Sum256(b); return s[:] }),
		hashOf("md5", func(b []byte) []byte { s := md5.Sum(b); return s[:] }),
		cel.Function("json.marshal", cel.Overload("json.marshal_dyn", []*cel.Type{cel.DynType}, cel.StringType,
			cel.UnaryBinding(func(v ref.Val) ref.Val { return jsonMarshal(v, limit) }))),
		cel.Function("json.unmarshal", cel.Overload("json.unmarshal_string", []*cel.Type{cel.StringType}, cel.DynType,
			cel.UnaryBinding(jsonUnmarshal))),
		cel.Function("lists.setAtIndex", cel.Overload("lists.setAtIndex_list_int_T", []*cel.Type{list, cel.IntType, cel.TypeParamType("T")}, list,
			cel.FunctionBinding(func(args ...ref.Val) ref.Val { return listAt("set", args...) }))),
		cel.Function("lists.insertAtIndex", cel.Overload("lists.insertAtIndex_list_int_T", []*cel.Type{list, cel.IntType, cel.TypeParamType("T")}, list,
			cel.FunctionBinding(func(args ...ref.Val) ref.Val { return listAt("insert", args...) }))),
		cel.Function("lists.removeAtIndex", cel.Overload("lists.removeAtIndex_list_int", []*cel.Type{list, cel.IntType}, list,
			cel.BinaryBinding(func(l, i ref.Val) ref.Val { return listAt("remove", l, i) }))),
		cel.Function("merge", cel.MemberOverload("map_merge", []*cel.Type{mapKV, mapKV}, mapKV,
			cel.BinaryBinding(func(a, b ref.Val) ref.Val { return merge(a, b, false) }))),
		cel.Function("deepMerge", cel.MemberOverload("dyn_deepmerge_dyn", []*cel.Type{cel.DynType, cel.DynType}, cel.DynType,
			cel.BinaryBinding(func(a, b ref.Val) ref.Val { return merge(a, b, true) }))),
	}
}

// seededString is kro's random.seededString: n characters of seedAlphabet,
// the i-th chosen by the big-endian uint32 at byte 4i (mod 32) of the
// seed's SHA-256.
func seededString(nv, seedv ref.Val) ref.Val {
	n, ok1 := nv.(types.Int)
	seed, ok2 := seedv.(types.String)
	switch {
	case !ok1 || !ok2:
		return types.MaybeNoSuchOverloadErr(nv)
	case n <= 0:
		return types.NewErr("random.seededString length must be positive, not %d", int64(n))
	}
	sum := sha256.Sum256([]byte(seed))
	out := make([]byte, n)
	for i := range out {
		at := (4 * i) % len(sum)
		out[i] = seedAlphabet[binary.BigEndian.Uint32(sum[at:at+4])%uint32(len(seedAlphabet))]
	}
	return types.String(out)
}

// seededInt is kro's random.seededInt: min plus the big-endian uint64 of
// the first 8 bytes of the seed's SHA-256, modulo max - min.
func seededInt(args ...ref.Val) ref.Val {
	lo, ok1 := args[0].(types.Int)
	hi, ok2 := args[1].(types.Int)
	seed, ok3 := args[2].(types.String)
	switch {
	case !ok1 || !ok2 || !ok3:
		return types.MaybeNoSuchOverloadErr(args[0])
	case lo >= hi:
		return types.NewErr("random.seededInt: min %d must be less than max %d", int64(lo), int64(hi))
	}
	sum := sha256.Sum256([]byte(seed))
	span := uint64(int64(hi) - int64(lo)) // two's complement: the width even when it overflows int64
	return types.Int(int64(lo) + int64(binary.BigEndian.Uint64(sum[:8])%span))
}

// jsonMarshal is json.marshal: v as JSON, as a template would write it
// (bytes base64, timestamps RFC 3339), at most limit bytes.
func jsonMarshal(v ref.Val, limit uint64) ref.Val {
	native, err := toNative(v, NewBudget(int64(min(limit, math.MaxInt64))))
	if err != nil {
		return types.NewErr("json.marshal: %v", err)
	}
	data, err := json.Marshal(native)
	if err != nil {
		return types.NewErr("json.marshal: %v", err)
	}
	return types.String(data)
}

// jsonUnmarshal is json.unmarshal: a whole number is an int (kro makes
// every number a double), so that it renders into an integer field.
func jsonUnmarshal(v ref.Val) ref.Val {
	s, ok := v.(types.String)
	if !ok {
		return types.MaybeNoSuchOverloadErr(v)
	}
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		return types.NewErr("json.unmarshal: %v", err)
	}
	if d.More() {
		return types.NewErr("json.unmarshal: more than one JSON value")
	}
	return types.DefaultTypeAdapter.NativeToValue(numbers(out))
}

// numbers replaces the json.Numbers in v with int64s where whole and in
// range, float64s otherwise.
func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	}
	return v
}

// listAt is lists.setAtIndex (op "set": args list, index, value),
// insertAtIndex ("insert": the index may be the list's size) and
// removeAtIndex ("remove": list, index): a new list, the argument as it
// was.
func listAt(op string, args ...ref.Val) ref.Val {
	l, ok := args[0].(traits.Lister)
	i, ok2 := args[1].(types.Int)
	if !ok || !ok2 {
		return types.MaybeNoSuchOverloadErr(args[0])
	}
	n := int(l.Size().(types.Int))
	last := n - 1
	if op == "insert" {
		last = n
	}
	if i < 0 || int64(i) > int64(last) {
		return types.NewErr("lists.%sAtIndex: index %d out of range for a list of %d", op, int64(i), n)
	}
	vals := make([]ref.Val, 0, n+1)
	for j := range n {
		vals = append(vals, l.Get(types.Int(j)))
	}
	switch op {
	case "set":
		vals[i] = args[2]
	case "insert":
		vals = slices.Insert(vals, int(i), args[2])
	case "remove":
		vals = slices.Delete(vals, int(i), int(i)+1)
	}
	return types.NewRefValList(types.DefaultTypeAdapter, vals)
}

// merge is a.merge(b) (deep: a.deepMerge(b)): a's entries with b's over
// them; deep, two maps under one key are merged in turn, anything else
// of b's replaces a's.
func merge(a, b ref.Val, deep bool) ref.Val {
	ma, ok1 := a.(traits.Mapper)
	mb, ok2 := b.(traits.Mapper)
	if !ok1 || !ok2 {
		if deep {
			return b // not two maps: b replaces a
		}
		return types.MaybeNoSuchOverloadErr(a)
	}
	out := make(map[ref.Val]ref.Val, int(celSize(ma)+celSize(mb)))
	for it := ma.Iterator(); it.HasNext() == types.True; {
		k := it.Next()
		out[k] = ma.Get(k)
	}
	for it := mb.Iterator(); it.HasNext() == types.True; {
		k := it.Next()
		v := mb.Get(k)
		if old, ok := out[k]; ok && deep {
			v = merge(old, v, true)
		}
		out[k] = v
	}
	return types.NewRefValMap(types.DefaultTypeAdapter, out)
}
