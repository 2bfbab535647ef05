package expr

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	apiservercel "k8s.io/apiserver/pkg/cel"
)

// Every function syncloop offers beyond cel-go's standard library is
// charged here, by the work it does. cel-go's tracker charges a call once
// it has returned, and the libraries charged some calls far below their
// work — a.deepMerge(b) by the result's top-level keys while it merged
// every nested map (400 merges of a 410 KB ConfigMap's data: 19 s, and no
// cost-limit error), l.flatten() by the top-level size of l while it
// copied every nested list (16,000 × 16,000 elements: minutes, gigabytes),
// s.replace(a, b) by its result after making a result of |s|×|b| bytes.
//
// callCosts has a row for every overload of the environment that is not
// the standard library's (TestEveryCallIsCharged fails for one without,
// so a function added later cannot ship uncharged). A row either charges
// the call itself (charge), or says why the library's own charge is the
// work: constant, or in proportion to the size of an argument the library
// charges by. A call that charge prices is measured before it is made
// (guardedCalls): one whose charge alone exceeds the limit ends the
// evaluation with the cost-limit error and is never made; otherwise it
// runs and the tracker charges it the same (costOptions), so that calls
// in a comprehension add up to the limit. The measuring walks stop once
// over the limit (tally): measuring costs no more than the limit.

// A chargeFunc is what a call costs from its arguments (the receiver
// first), at most limit+1: more than the limit.
type chargeFunc func(args []ref.Val, limit uint64) uint64

// callCost is how the calls of one overload are charged.
type callCost struct {
	// model is the charge as docs/rules.md tells rule authors.
	model string
	// charge prices the call before it is made and after; nil: the
	// library's own charge stands (model says what it is).
	charge chargeFunc
	// after: charge prices the call only once it has returned. Its
	// library binds it for all its overloads at once (a singleton
	// binding, which cel-go lets no one redefine), and its work is less
	// than its charge.
	after bool
	// row is the row of callCosts the overload is in: the overloads of
	// one function in one row are charged alike.
	row int
}

// callCosts are the charges by overload ID.
var callCosts = costTable(
	// kro's functions (kro.go).
	charged("1 + the length asked + the seed's bytes", seededStringCost, "random.seededString_int_string"),
	charged("1 + the seed's bytes", bytesCost(2), "random.seededInt_int_int_string"),
	charged("1 + the string's bytes", bytesCost(0), "hash.fnv64a_string", "hash.sha256_string", "hash.md5_string", "json.unmarshal_string"),
	charged("1 + every value, map entry and byte of the value, at every depth", weightCost(0, bytesWrite), "json.marshal_dyn"),
	charged("2 + the list's size", sizeCost(0, 2), "lists.setAtIndex_list_int_T", "lists.insertAtIndex_list_int_T", "lists.removeAtIndex_list_int"),
	charged("1 + 2 × both maps' entries (read and written)", mergeCost(false), "map_merge"),
	charged("1 + 2 × both maps' entries, and those of every two maps under one key, at every depth", mergeCost(true), "dyn_deepmerge_dyn"),

	// cel-go's strings (ext.Strings): cel-go's charges, where they are
	// the work, counted before the call where it may be more than its input.
	byLibrary("2 + 0.1 a character (cel-go)", "string_char_at_int"),
	charged("1 + 0.1 × the string's characters × the needle's (every position compared with the needle)", searchCost,
		"string_index_of_string", "string_index_of_string_int", "string_last_index_of_string", "string_last_index_of_string_int"),
	byLibrary("1 + 0.1 a character + the result's characters (cel-go)", "string_lower_ascii", "string_upper_ascii", "string_trim",
		"string_substring_int", "string_substring_int_int"),
	charged("1 + 0.1 a character + the characters made", stringReverseCost, "string_reverse"),
	charged("1 + 0.1 × the string's characters × the replaced's + the result's characters, counted before the call", replaceCost,
		"string_replace_string_string", "string_replace_string_string_int"),
	byLibrary("11 + 0.1 a character + the parts made (cel-go)", "string_split_string", "string_split_string_int"),
	charged("1 + 0.1 an element + the bytes of the string made", joinCost, "list_join", "list_join_string"),
	charged("1 + 0.1 a character of the format + every value, map entry and byte of the arguments, at every depth", formatCost, "string_format"),
	byLibrary("0.1 a character (cel-go)", "strings_quote"),

	// cel-go's lists (ext.Lists).
	byLibrary("11 + the slice's size (cel-go)", "list_slice"),
	charged("11 + every element flattened into the result, at every depth flattened", flattenCost, "list_flatten", "list_flatten_int"),
	byLibrary("11 + the size; more than 1,000,000 is refused before (cel-go)", "lists_range"),
	charged("11 + the list's size", sizeCost(0, costCall+costListCreate), "list_reverse"),
	charged("11 + 2 × (the size² + the size × what the elements hold)", distinctCost, "list_distinct"),
	byLibrary("1 (cel-go)", "list_first", "list_last"),
	chargedAfter("11 + 2 × the size² (2.1 × for strings and bytes), as cel-go, after the call: sorting compares n log n pairs",
		sortCost(0), listOverloads("list_%s_sort", sortTypes)...),
	chargedAfter("11 + 2 × the keys' size² (2.1 × for strings and bytes), as cel-go, after the call: sorting compares n log n pairs",
		sortCost(1), listOverloads("list_%s_sortByAssociatedKeys", sortTypes)...),

	// cel-go's sets (ext.Sets): each element of one compared with each of
	// the other.
	charged("1 + the sizes' product + what comparing their nested elements reads", setsCost(1), "list_sets_contains_list", "list_sets_intersects_list"),
	charged("1 + 2 × (the sizes' product + what comparing their nested elements reads)", setsCost(2), "list_sets_equivalent_list"),

	// cel-go's math (ext.Math).
	charged("1 + the list's size", sizeCost(0, costCall), mathListOverloads()...),
	byLibrary("1: a number or two (cel-go)", mathScalarOverloads()...),

	// cel-go's encoders (ext.Encoders).
	charged("1 + 0.1 a character + the bytes made", base64DecodeCost, "base64_decode_string"),
	charged("1 + 0.1 a byte + the characters made", base64EncodeCost, "base64_encode_bytes"),
	charged("1 + every value, map entry and byte of the value, at every depth", weightCost(0, bytesWrite), "json_encode_dyn"),

	// What macros expand to, and optional types: internal names no
	// expression can spell (cel.@block, cel.@mapInsert), or constant.
	byLibrary("1: the accumulator is inserted into in place", "@mapInsert_map_key_value"),
	charged("1 + the entries inserted", sizeCost(1, costCall), "@mapInsert_map_map"),
	byLibrary("1", "cel_block_list"),
	charged("1 + the list's size", sizeCost(0, costCall), "optional_unwrap", "optional_unwrapOpt"),
	byLibrary("1", "optional_of", "optional_ofNonZeroValue", "optional_none", "optional_hasValue", "optional_value",
		"optional_or_optional", "optional_orValue_value", "select_optional_field", "list_optindex_optional_int",
		"map_optindex_optional_value", "optional_list_optindex_optional_int", "optional_map_optindex_optional_value",
		"optional_list_index_int", "optional_map_index_value"),

	// The Kubernetes library (k8s.io/apiserver/pkg/cel/library): the API
	// server's charges where they are the work.
	byLibrary("0.1 a character (Kubernetes)", "string_to_url", "string_to_ip", "is_ip", "string_to_cidr", "is_cidr",
		"string_to_semver", "is_semver_string", "string_to_quantity", "is_quantity_string"),
	charged("1 + 0.1 a character", stringCost(0), "is_url_string"),
	byLibrary("1 (Kubernetes)", "url_get_scheme", "url_get_host", "url_get_hostname", "url_get_port"),
	charged("1 + the bytes of the part made", urlPartCost, "url_get_escaped_path", "url_get_query"),
	charged("(1 + 0.1 a character) × the regex's characters / 4, as the API server, before the call", findCost,
		"string_find_string", "string_find_all_string", "string_find_all_string_int"),
	charged("1 + every element (and 0.1 a character of strings) read", weightCost(0, bytesRead),
		slices.Concat(listOverloads("list_%s_is_sorted_bool", k8sListTypes), listOverloads("list_%s_max_%[1]s", k8sListTypes),
			listOverloads("list_%s_min_%[1]s", k8sListTypes), listOverloads("list_%s_sum_%[1]s", k8sSumTypes))...),
	charged("1 + the size + what comparing nested elements reads", indexCost, "list_a_index_of_int", "list_a_last_index_of_int"),
	byLibrary("0.2 a character (Kubernetes)", "ip_is_canonical"),
	byLibrary("1 (Kubernetes): an address or prefix, at most 16 bytes", "ip_family", "ip_is_unspecified", "ip_is_loopback",
		"ip_is_link_local_multicast", "ip_is_link_local_unicast", "ip_is_global_unicast", "ip_to_string", "cidr_ip",
		"cidr_masked", "cidr_prefix_length", "cidr_to_string"),
	byLibrary("0.1 a byte of the prefix, and of a string parsed (Kubernetes)", "cidr_contains_ip_ip", "cidr_contains_ip_string",
		"cidr_contains_cidr", "cidr_contains_cidr_string"),
	byLibrary("1 (Kubernetes): a quantity or a version", "quantity_sign", "quantity_get_int", "quantity_get_float",
		"quantity_is_integer", "quantity_add", "quantity_add_int", "quantity_sub", "quantity_sub_int", "quantity_compare_to",
		"quantity_is_greater_than", "quantity_is_less_than", "semver_major", "semver_minor", "semver_patch",
		"semver_compare_to", "semver_is_greater_than", "semver_is_less_than"),
	byLibrary("1 (Kubernetes): a named format", "format-named", "format.byte", "format.date", "format.datetime",
		"format.dns1035Label", "format.dns1035LabelPrefix", "format.dns1123Label", "format.dns1123LabelPrefix",
		"format.dns1123Subdomain", "format.dns1123SubdomainPrefix", "format.labelValue", "format.qualifiedName",
		"format.uri", "format.uuid"),
	byLibrary("(1 + 0.1 a character) × the format's longest regex / 4 (Kubernetes)", "format-validate"),
)

// A costRow gives overloads one cost.
type costRow struct {
	ids  []string
	cost callCost
}

// charged is a row of overloads charged by charge.
func charged(model string, charge chargeFunc, ids ...string) costRow {
	return costRow{ids: ids, cost: callCost{model: model, charge: charge}}
}

// chargedAfter is a row of overloads charged by charge once they have
// returned (callCost.after).
func chargedAfter(model string, charge chargeFunc, ids ...string) costRow {
	return costRow{ids: ids, cost: callCost{model: model, charge: charge, after: true}}
}

// byLibrary is a row of overloads whose library's charge stands.
func byLibrary(model string, ids ...string) costRow {
	return costRow{ids: ids, cost: callCost{model: model}}
}

// costTable is the rows by overload ID; an ID in two rows is a
// programming error.
func costTable(rows ...costRow) map[string]callCost {
	table := map[string]callCost{}
	for i, r := range rows {
		for _, id := range r.ids {
			if _, dup := table[id]; dup {
				panic(fmt.Sprintf("internal: overload %s has two rows in callCosts", id))
			}
			cost := r.cost
			cost.row = i
			table[id] = cost
		}
	}
	return table
}

// The element types of the typed list overloads.
var (
	sortTypes    = []string{"bool", "bytes", "double", "google.protobuf.Duration", "google.protobuf.Timestamp", "int", "string", "uint"}
	k8sListTypes = []string{"bool", "bytes", "double", "duration", "int", "string", "timestamp", "uint"}
	k8sSumTypes  = []string{"double", "duration", "int", "uint"}
)

// listOverloads are the overload IDs of format, one for each element type.
func listOverloads(format string, elems []string) []string {
	ids := make([]string, len(elems))
	for i, t := range elems {
		ids[i] = fmt.Sprintf(format, t)
	}
	return ids
}

// mathListOverloads are math.greatest and math.least of a list;
// mathScalarOverloads every other math function, of one or two numbers.
func mathListOverloads() []string {
	var ids []string
	for _, f := range []string{"max", "min"} {
		for _, t := range []string{"double", "int", "uint"} {
			ids = append(ids, "math_@"+f+"_list_"+t)
		}
	}
	return ids
}

func mathScalarOverloads() []string {
	nums := []string{"double", "int", "uint"}
	var ids []string
	for _, f := range []string{"max", "min"} {
		for _, a := range nums {
			ids = append(ids, "math_@"+f+"_"+a)
			for _, b := range nums {
				ids = append(ids, "math_@"+f+"_"+a+"_"+b)
			}
		}
	}
	for _, f := range []string{"abs", "sign", "sqrt"} {
		ids = append(ids, listOverloads("math_"+f+"_%s", nums)...)
	}
	for _, f := range []string{"ceil", "floor", "isFinite", "isInf", "isNaN", "round", "trunc"} {
		ids = append(ids, "math_"+f+"_double")
	}
	for _, f := range []string{"bitAnd", "bitOr", "bitXor"} {
		ids = append(ids, "math_"+f+"_int_int", "math_"+f+"_uint_uint")
	}
	return append(ids, "math_bitNot_int_int", "math_bitNot_uint_uint", "math_bitShiftLeft_int_int",
		"math_bitShiftLeft_uint_int", "math_bitShiftRight_int_int", "math_bitShiftRight_uint_int")
}

// The charges.

// bytesCost is 1 + the bytes of argument i.
func bytesCost(i int) chargeFunc {
	return func(args []ref.Val, _ uint64) uint64 { return costCall + byteLen(args[i]) }
}

// sizeCost is base + the size of argument i.
func sizeCost(i int, base uint64) chargeFunc {
	return func(args []ref.Val, _ uint64) uint64 { return base + celSize(args[i]) }
}

// stringCost is 1 + 0.1 a character of argument i.
func stringCost(i int) chargeFunc {
	return func(args []ref.Val, _ uint64) uint64 { return costCall + traversal(celSize(args[i])) }
}

// weightCost is 1 + what reading argument i whole costs (weigh).
func weightCost(i int, perUnit uint64) chargeFunc {
	return func(args []ref.Val, limit uint64) uint64 { return costCall + weight(args[i], limit, perUnit) }
}

func seededStringCost(args []ref.Val, limit uint64) uint64 {
	n, _ := args[0].(types.Int)
	if n <= 0 {
		return costCall
	}
	return costCall + min(uint64(n), limit+1) + byteLen(args[1])
}

func mergeCost(deep bool) chargeFunc {
	return func(args []ref.Val, limit uint64) uint64 {
		t := &tally{limit: limit}
		t.add(costCall)
		a, okA := args[0].(traits.Mapper)
		b, okB := args[1].(traits.Mapper)
		if okA && okB {
			merging(a, b, deep, t)
		}
		return t.count()
	}
}

// searchCost is cel-go's charge of indexOf and lastIndexOf: every
// position of the string compared with the needle.
func searchCost(args []ref.Val, _ uint64) uint64 {
	return costCall + traversal(mul(celSize(args[0]), celSize(args[1])))
}

func stringReverseCost(args []ref.Val, _ uint64) uint64 {
	n := celSize(args[0])
	return costCall + traversal(n) + n
}

// replaceCost is cel-go's charge of replace — the search, and the
// characters of the result — with the result's size counted from the
// occurrences before it is made.
func replaceCost(args []ref.Val, limit uint64) uint64 {
	s, ok1 := args[0].(types.String)
	old, ok2 := args[1].(types.String)
	repl, ok3 := args[2].(types.String)
	if !ok1 || !ok2 || !ok3 {
		return costCall
	}
	n, o, r := runes(s), runes(old), runes(repl)
	search := traversal(mul(max(n, 1), max(o, 1)))
	if search > limit {
		return limit + 1
	}
	k := n + 1 // "" is found before every character and at the end
	if old != "" {
		k = uint64(strings.Count(string(s), string(old)))
	}
	if len(args) == 4 {
		if most, ok := args[3].(types.Int); ok && most >= 0 {
			k = min(k, uint64(most))
		}
	}
	made := n - mul(k, o) + min(mul(k, r), limit+1) // each occurrence's characters replaced
	return min(costCall+search+made, limit+1)
}

// joinCost is cel-go's charge of join with the result's size counted
// from the strings joined before it is made: a list may hold one long
// string many times.
func joinCost(args []ref.Val, limit uint64) uint64 {
	l, ok := args[0].(traits.Lister)
	if !ok {
		return costCall
	}
	var sep uint64
	if len(args) == 2 {
		sep = byteLen(args[1])
	}
	n := celSize(l)
	t := &tally{limit: limit}
	t.add(costCall + traversal(n+1))
	for it := l.Iterator(); it.HasNext() == types.True; {
		if !t.add(byteLen(it.Next()) + sep) {
			break
		}
	}
	return t.count()
}

func formatCost(args []ref.Val, limit uint64) uint64 {
	return costCall + traversal(celSize(args[0])) + weight(args[1], limit, bytesWrite)
}

func flattenCost(args []ref.Val, limit uint64) uint64 {
	depth := int64(1)
	if len(args) == 2 {
		d, ok := args[1].(types.Int)
		if !ok || d < 0 {
			return costCall // refused by flatten
		}
		depth = int64(d)
	}
	l, ok := args[0].(traits.Lister)
	if !ok {
		return costCall
	}
	t := &tally{limit: limit}
	t.add(costCall + costListCreate)
	flattening(l, depth, t)
	return t.count()
}

func distinctCost(args []ref.Val, limit uint64) uint64 {
	l, ok := args[0].(traits.Lister)
	if !ok {
		return costCall
	}
	return min(costCall+costListCreate+mul(2, comparing(l, l, limit)), limit+1)
}

// sortCost is cel-go's charge of sort (arg 0) and sortBy (arg 1, the
// keys): a comparison of each pair.
func sortCost(arg int) chargeFunc {
	return func(args []ref.Val, limit uint64) uint64 {
		l, ok := args[arg].(traits.Lister)
		if !ok {
			return costCall
		}
		n := celSize(l)
		if mul(n, n) > limit {
			return limit + 1
		}
		factor := 2.0
		if n > 0 {
			if t := l.Get(types.IntZero).Type(); t == types.StringType || t == types.BytesType {
				factor += 0.1
			}
		}
		return uint64(float64(n*n)*factor) + costCall + costListCreate
	}
}

func setsCost(factor uint64) chargeFunc {
	return func(args []ref.Val, limit uint64) uint64 {
		a, okA := args[0].(traits.Lister)
		b, okB := args[1].(traits.Lister)
		if !okA || !okB {
			return costCall
		}
		return min(costCall+mul(factor, comparing(a, b, limit)), limit+1)
	}
}

// indexCost is what a list's indexOf and lastIndexOf cost: each element
// compared with the one sought.
func indexCost(args []ref.Val, limit uint64) uint64 {
	l, ok := args[0].(traits.Lister)
	if !ok {
		return costCall
	}
	sought := types.NewRefValList(types.DefaultTypeAdapter, []ref.Val{args[1]})
	return min(costCall+comparing(l, sought, limit), limit+1)
}

func base64EncodeCost(args []ref.Val, _ uint64) uint64 {
	n := byteLen(args[0])
	return costCall + traversal(n) + 4*(n/3+min(n%3, 1))
}

func base64DecodeCost(args []ref.Val, _ uint64) uint64 {
	n := byteLen(args[0])
	return costCall + traversal(n) + n
}

func urlPartCost(args []ref.Val, _ uint64) uint64 {
	u, ok := args[0].(apiservercel.URL)
	if !ok || u.URL == nil {
		return costCall
	}
	return costCall + uint64(len(u.Path)+len(u.RawPath)+len(u.RawQuery))
}

// findCost is the API server's charge of find and findAll: each
// character of the string against the regex.
func findCost(args []ref.Val, _ uint64) uint64 {
	str := uint64(math.Ceil((1 + float64(celSize(args[0]))) * 0.1))
	regex := uint64(math.Ceil(float64(celSize(args[1])) * 0.25))
	return mul(str, regex)
}
