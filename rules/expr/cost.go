package expr

import (
	"math"
	"slices"
	"sync"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/stdlib"
	"github.com/google/cel-go/common/types"
	"k8s.io/apiserver/pkg/cel/library"
)

// Cost limits without the runtime tax. cel-go's cost tracker counts every
// step of an evaluation, which costs more than the steps themselves: on a
// rule that compares each of 64 values with each other (the benchmark's
// CEL-heavy rule) a tracked evaluation takes 4 times as long as an
// untracked one. The limit is kept by proving instead of counting where
// the proof is cheap:
//
//   - At compile time the checker's cost estimate — the worst case over
//     every input, as the API server computes it for CRD validation rules
//     — may already be within the limit (a field read, a comparison,
//     anything that does not iterate over input): the program runs
//     untracked, always.
//   - Otherwise the estimate grows with the sizes of the lists, maps and
//     strings the expression reads. At compile time the largest size S is
//     found for which the estimate, every such value being of size S, is
//     within the limit, and the paths the estimate asked sizes of are
//     kept. Before each evaluation the activation's values at those paths
//     are measured (items included); if none is larger than S, the
//     untracked program runs: the tracked one could not have stopped it.
//     Otherwise, or where a size cannot be told, the tracked program runs
//     and stops at the limit as before.
//
// The estimate is an upper bound of what the tracker counts for the
// standard library and for the extension functions
// TestCostEstimateBoundsActual checks it on (estimable) — an expression
// calling any other is always tracked — so the two runs stop the same
// expressions (TestCostPlanKeepsTheLimit).

// costPlan is how a program keeps its cost limit. It is made by the
// program's first evaluation, so that loading rules — and validate —
// costs no more than compiling them.
type costPlan struct {
	env   *cel.Env
	ast   *cel.Ast // as checked
	limit uint64

	once sync.Once
	// estimated is ast as the estimate reads it (estimated).
	estimated *cel.Ast
	// fast is the program without cost tracking; nil: always tracked.
	fast cel.Program
	// bounded: the estimate over every input is within the limit, so fast
	// always runs. Otherwise fast runs when no value at paths is larger
	// than maxSize.
	bounded bool
	paths   [][]string
	maxSize uint64
}

// make decides how the program keeps its limit.
func (c *costPlan) make() {
	var err error
	if c.estimated, err = estimated(c.ast); err != nil || !allEstimable(c.estimated) {
		return
	}
	est, err := c.env.EstimateCost(c.estimated, &library.CostEstimator{})
	if err != nil {
		return
	}
	c.bounded = est.Max <= c.limit
	if !c.bounded {
		if c.maxSize = c.largestSize(); c.maxSize == 0 {
			return // even inputs of size 1 may cost more: always tracked
		}
	}
	c.fast, _ = c.env.Program(c.ast, cel.InterruptCheckFrequency(100), guardComparisons(c.ast, c.limit))
}

// largestSize is the largest size of the values the expression reads for
// which the estimate stays within the limit (to within 1/16), or 0; it
// sets paths to those the estimate asks sizes of.
func (c *costPlan) largestSize() uint64 {
	within := func(size uint64) bool {
		sizes := &uniformSizes{size: size}
		est, err := c.env.EstimateCost(c.estimated, &library.CostEstimator{SizeEstimator: sizes})
		c.paths = sizes.paths
		return err == nil && est.Max <= c.limit
	}
	if !within(1) {
		return 0
	}
	// The largest power of two within, then 4 halvings of the rest.
	lo, hi := 0, 31
	for lo < hi {
		if mid := (lo + hi + 1) / 2; within(1 << mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	size, step := uint64(1)<<lo, uint64(1)<<lo
	for range 4 {
		if step /= 2; step > 0 && within(size+step) {
			size += step
		}
	}
	within(size) // the paths, as asked at that size
	return size
}

// untracked reports whether an evaluation over a may run without the cost
// tracker.
func (c *costPlan) untracked(a *Activation) bool {
	c.once.Do(c.make)
	switch {
	case c.fast == nil:
		return false
	case c.bounded:
		return true
	}
	for _, path := range c.paths {
		size, ok := sizeAt(a.native(path[0]), path[1:])
		if !ok || size > c.maxSize {
			return false
		}
	}
	return true
}

// activationVars are the names an activation binds: the first element of
// a path the estimate asks a size of, if the size is the activation's.
var activationVars = map[string]bool{varObject: true, varVariables: true, varRule: true, varItem: true,
	varIndex: true, varChildren: true, varLookups: true, varReady: true, varSelf: true, varClusters: true}

// uniformSizes estimates every value the activation holds to be of one
// size, and records the paths it was asked about.
type uniformSizes struct {
	size  uint64
	paths [][]string
}

func (s *uniformSizes) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	path := n.Path()
	if len(path) == 0 || !activationVars[path[0]] {
		return nil
	}
	if !slices.ContainsFunc(s.paths, func(p []string) bool { return slices.Equal(p, path) }) {
		s.paths = append(s.paths, slices.Clone(path))
	}
	return &checker.SizeEstimate{Min: 0, Max: s.size}
}

func (*uniformSizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// estimable are the overloads whose cost estimate bounds what the tracker
// counts: the standard library's, and those of the extensions that
// TestCostEstimateBoundsActual exercises. Not among them: join, whose
// estimate leaves out the size of the strings joined; nor the calls
// charged by what their arguments hold at every depth (callCosts:
// flatten, format, sets.contains, …) or by a size the estimate does not
// count (math.greatest of a list, base64.encode), which the estimate,
// knowing only the sizes of what is read, cannot bound.
var estimable = func() map[string]bool {
	ids := map[string]bool{}
	for _, f := range stdlib.Functions() {
		for _, o := range f.OverloadDecls() {
			ids[o.ID()] = true
		}
	}
	for _, id := range vettedOverloads {
		ids[id] = true
	}
	return ids
}()

// vettedOverloads are the extensions' overloads in estimable.
var vettedOverloads = []string{
	"@mapInsert_map_key_value", "cidr_contains_ip_string", "cidr_to_string",
	"format-validate", "format.dns1123Label", "ip_family", "ip_to_string", "is_cidr", "is_semver_string",
	"list_bool_sort", "list_bytes_sort", "list_double_sort", "list_google.protobuf.Duration_sort",
	"list_google.protobuf.Timestamp_sort", "list_int_sort", "list_reverse",
	"list_slice", "list_string_sort", "list_uint_sort", "optional_hasValue",
	"optional_list_index_int", "optional_map_index_value", "optional_orValue_value", "quantity_is_greater_than",
	"select_optional_field", "semver_is_greater_than", "string_find_all_string", "string_find_string",
	"string_index_of_string", "string_lower_ascii", "string_replace_string_string",
	"string_reverse", "string_split_string", "string_to_cidr", "string_to_ip", "string_to_quantity",
	"string_to_semver", "string_to_url", "string_trim", "string_upper_ascii", "url_get_host",
}

// allEstimable reports whether every call of checked is to an estimable
// overload.
func allEstimable(checked *cel.Ast) bool {
	native, ok := checked.NativeRep(), true
	ast.PreOrderVisit(native.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		for _, id := range native.GetOverloadIDs(e.ID()) {
			ok = ok && estimable[id]
		}
	}))
	return ok
}

// estimated is checked with the type of every operand of a field
// selection that is dyn made a map: the estimate counts a selection's cost
// only on a map or a message, where the tracker counts it on every value
// — and a selection that succeeds has one of them as its operand.
func estimated(checked *cel.Ast) (*cel.Ast, error) {
	pb, err := cel.AstToCheckedExpr(checked)
	if err != nil {
		return nil, err
	}
	mapType, err := types.TypeToExprType(types.NewMapType(types.StringType, types.DynType))
	if err != nil {
		return nil, err
	}
	typeMap := checked.NativeRep().TypeMap()
	ast.PreOrderVisit(checked.NativeRep().Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() != ast.SelectKind {
			return
		}
		op := e.AsSelect().Operand()
		if t, ok := typeMap[op.ID()]; ok && t.Kind() == types.DynKind {
			pb.TypeMap[op.ID()] = mapType
		}
	}))
	return cel.CheckedExprToAst(pb), nil
}

// sizeAt is the largest size of the values path reaches from v, as CEL's
// size() counts it (a string's code points, a list's items, a map's
// entries); 0 when it reaches none (an absent field fails or tests false
// before any cost depends on its size). It is false when it reaches a
// value whose size it cannot tell, so that the estimate assumes the worst.
//
// Where the checker did not know a container's kind (dyn), its path
// elements guess: it iterates a list's items or a map's keys ("@keys" for
// both), indexes a list or a map ("@items" or "@values" for both). So on a
// list every element means its items, and on a map "@items" means its
// keys and its values.
func sizeAt(v any, path []string) (uint64, bool) {
	if len(path) == 0 {
		return sizeOf(v)
	}
	var largest uint64
	reach := func(v any) bool {
		n, ok := sizeAt(v, path[1:])
		largest = max(largest, n)
		return ok
	}
	switch v := v.(type) {
	case nil:
		return 0, true
	case map[string]any:
		if path[0] == "@keys" || path[0] == "@items" {
			for k := range v {
				if !reach(k) {
					return 0, false
				}
			}
		}
		if path[0] == "@values" || path[0] == "@items" {
			for _, e := range v {
				if !reach(e) {
					return 0, false
				}
			}
		}
		// A field, or a key spelled like a path element: the largest of
		// all is an upper bound either way.
		if e, ok := v[path[0]]; ok && !reach(e) {
			return 0, false
		}
		return largest, true
	case map[string]bool:
		m := make(map[string]any, len(v))
		for k, b := range v {
			m[k] = b
		}
		return sizeAt(m, path)
	case []any:
		switch path[0] {
		case "@items", "@keys", "@values":
			for _, e := range v {
				if !reach(e) {
					return 0, false
				}
			}
			return largest, true
		}
	}
	return 0, false
}

// sizeOf is v's size as CEL counts it; false when v has none CEL knows
// here (a number has no size; a value of another Go type is not guessed).
func sizeOf(v any) (uint64, bool) {
	switch v := v.(type) {
	case nil:
		return 0, true
	case string:
		return uint64(utf8.RuneCountInString(v)), true
	case []byte:
		return uint64(len(v)), true
	case []any:
		return uint64(len(v)), true
	case map[string]any:
		return uint64(len(v)), true
	case map[string]bool:
		return uint64(len(v)), true
	case bool, int64, float64, int, uint64, int32:
		// Sizeless: an estimate does not ask, but a bound is one.
		return 1, true
	}
	return math.MaxUint64, false
}
