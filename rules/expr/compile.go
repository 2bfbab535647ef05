package expr

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Scope says which names an expression may refer to.
type Scope struct {
	// Variables are the variables declared before this expression.
	Variables []string
	// ForEach makes item and index available.
	ForEach bool
	// Children, when not nil, makes children available with these ids: the
	// live children of a resource's dependencies, or of every resource in
	// the status.
	Children []string
	// Status adds ready.<id> (with the Children ids): whether a resource's
	// children all exist and are ready. Status may use children freely;
	// elsewhere children must be followed by a literal id, so that a
	// resource's dependencies are known at load.
	Status bool
	// Self is the scope of readyWhen: self, the live child, and nothing
	// else.
	Self bool
	// Lookups are the ids of the rule's lookups this expression may read
	// (none in the rule's `when`).
	Lookups []string
	// InLookup is the scope of a lookup's namespace, name and selector:
	// lookups must be followed by a literal id there, so that the order
	// lookups are read in is known at load.
	InLookup bool
	// Types, when not nil, types object, lookups.<id> and children.<id>
	// from the schemas of their kinds; nil: they are dyn.
	Types *Types
	// Cluster makes cluster available ({name, labels}): the cluster a
	// resource that targets clusters renders a child for.
	Cluster bool
	// ClusterOnly is the scope of a rollout's cluster steps: cluster and
	// rule, and nothing of a trigger.
	ClusterOnly bool
	// Item is the type of item inside forEach (Program.Elem of the
	// forEach), SelfType the type of self in readyWhen; nil: dyn.
	Item, SelfType *Type
}

// typed reports whether anything in the scope has a type.
func (s Scope) typed() bool { return s.Types != nil || s.Item != nil || s.SelfType != nil }

// Result says what type an expression must produce.
type Result int

const (
	// AnyResult accepts every type.
	AnyResult Result = iota
	// BoolResult requires bool (or dyn, checked when evaluated).
	BoolResult
	// ListResult requires a list (or dyn, checked when evaluated).
	ListResult
	// StringResult requires a string (or dyn, checked when evaluated).
	StringResult
)

func (r Result) String() string {
	switch r {
	case BoolResult:
		return "bool"
	case ListResult:
		return "list"
	case StringResult:
		return "string"
	}
	return "any"
}

// Error is a compile error. Offset is the byte offset in the compiled source
// where the problem is, or -1 when it is the source as a whole.
type Error struct {
	Offset int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Program is a compiled expression. It is immutable and safe for concurrent
// use.
type Program struct {
	src    string
	result Result
	prog   cel.Program // with the cost tracker
	cost   *costPlan   // when prog's tracker may be skipped; its limit
	// childRefs are the resource ids the program reads as children.<id>,
	// sorted; lookupRefs and variableRefs likewise the lookup ids and the
	// variables it reads.
	childRefs, lookupRefs, variableRefs []string
	// out is what the checker says the program produces.
	out *types.Type
	// vt convert the activation's values to the types the program was
	// checked with; nil: untyped.
	vt *valueTypes
	// elem is the type of the items of a list the program produces.
	elem *Type
	// outSchema is the schema of what a status program produces
	// (OutputSchema); outExact: no part of it is dyn.
	outSchema *spec.Schema
	outExact  bool
}

// Elem is the type of the items of the list the program produces, when
// the schemas tell (a forEach over object.spec.ports); nil: dyn.
func (p *Program) Elem() *Type { return p.elem }

// Output is the type the expression is known to produce when it loads:
// TypeString, TypeInt, …, or TypeDyn when only evaluating tells.
func (p *Program) Output() OutputType {
	switch p.out.Kind() {
	case types.StringKind, types.TimestampKind, types.DurationKind, types.BytesKind:
		// Timestamps, durations and bytes render as strings (RFC 3339,
		// Go durations, base64).
		return TypeString
	case types.IntKind, types.UintKind:
		return TypeInt
	case types.DoubleKind:
		return TypeDouble
	case types.BoolKind:
		return TypeBool
	case types.ListKind:
		return TypeList
	case types.MapKind:
		return TypeMap
	case types.NullTypeKind:
		return TypeNull
	}
	return TypeDyn
}

// OutputType is what an expression produces, as far as is known at load.
type OutputType int

const (
	TypeDyn OutputType = iota
	TypeString
	TypeInt
	TypeDouble
	TypeBool
	TypeList
	TypeMap
	TypeNull
)

// Source is the expression as written.
func (p *Program) Source() string { return p.src }

// ChildRefs are the resource ids the expression reads as children.<id>,
// sorted and without duplicates: its dependencies.
func (p *Program) ChildRefs() []string { return p.childRefs }

// LookupRefs are the lookup ids the expression reads as lookups.<id>,
// sorted and without duplicates.
func (p *Program) LookupRefs() []string { return p.lookupRefs }

// VariableRefs are the variables the expression reads as variables.<name>,
// sorted and without duplicates.
func (p *Program) VariableRefs() []string { return p.variableRefs }

// Compile compiles src in scope and checks that it can produce want.
func (c *Compiler) Compile(src string, scope Scope, want Result) (*Program, error) {
	if strings.TrimSpace(src) == "" {
		return nil, &Error{Offset: -1, Msg: "empty expression"}
	}
	if scope.Status && scope.ForEach {
		return nil, &Error{Offset: -1, Msg: "internal: forEach and status scopes are exclusive"}
	}
	parsed, iss := c.lib.Parse(src)
	if iss != nil && iss.Err() != nil {
		return nil, issueError(src, iss)
	}
	refs, err := checkScope(parsed, src, scope)
	if err != nil {
		return nil, err
	}
	if scope.typed() {
		// children['per-team'] reads a field of the children struct, as
		// children.x does: the checker types it only as a select.
		indexToSelect(parsed, varChildren)
		indexToSelect(parsed, varLookups)
	}

	if !scope.Self {
		// The rule's environment declares every name (and every
		// environment cluster): those this scope does not have are
		// rejected here, as the checker would.
		if err := outOfScope(parsed, src, scope); err != nil {
			return nil, err
		}
	}
	env, prov, err := c.env(scope, refs.dynChildren, refs.dynLookupsAt >= 0)
	if err != nil {
		return nil, &Error{Offset: -1, Msg: err.Error()}
	}
	checked, iss := env.Check(parsed)
	if iss != nil && iss.Err() != nil {
		return nil, c.checkError(src, iss, prov)
	}
	if err := checkResult(checked.OutputType(), want); err != nil {
		return nil, err
	}
	prog, err := env.Program(checked, append(slices.Clip(c.costOpts),
		cel.CostLimit(c.costLimit),
		cel.InterruptCheckFrequency(100),
		guardComparisons(checked, c.costLimit),
	)...)
	if err != nil {
		return nil, &Error{Offset: -1, Msg: err.Error()}
	}
	variableRefs, _ := references(parsed, src, varVariables)
	p := &Program{src: src, result: want, prog: prog, cost: &costPlan{env: env, ast: checked, limit: c.costLimit}, childRefs: refs.children, lookupRefs: refs.lookups,
		variableRefs: variableRefs, out: checked.OutputType()}
	if scope.Status {
		p.outSchema, p.outExact = prov.schemaOfCEL(checked.OutputType())
	}
	if scope.typed() {
		p.vt = scope.valueTypes()
		if prov != nil && checked.OutputType().Kind() == types.ListKind {
			p.elem = prov.fromCEL(checked.OutputType().Parameters()[0])
		}
	}
	return p, nil
}

// scopeRefs are what an expression reads of children and lookups.
type scopeRefs struct {
	children, lookups []string
	// dynChildren: it reads children other than as children.<id> (the
	// status may); dynLookupsAt: where it reads lookups so, or -1.
	dynChildren  bool
	dynLookupsAt int
}

// checkScope checks the names parsed reads inside variables, lookups and
// children — known at load: an undeclared one is reported as such, before
// types are checked — and returns the children and lookups it reads.
func checkScope(parsed *cel.Ast, src string, scope Scope) (scopeRefs, error) {
	var refs scopeRefs
	if err := checkReferences(parsed, src, varVariables, "variable", scope.Variables); err != nil {
		return refs, err
	}
	if err := checkReferences(parsed, src, varLookups, "lookup id", scope.Lookups); err != nil {
		return refs, err
	}
	if scope.Children != nil {
		if err := checkReferences(parsed, src, varChildren, "resource id", scope.Children); err != nil {
			return refs, err
		}
		if scope.Status {
			if err := checkReferences(parsed, src, varReady, "resource id", scope.Children); err != nil {
				return refs, err
			}
		}
		var dynamicAt int
		refs.children, dynamicAt = references(parsed, src, varChildren)
		if dynamicAt >= 0 && !scope.Status {
			return refs, &Error{Offset: dynamicAt, Msg: "children must be followed by a resource id, as in children.db: " +
				"a resource's dependencies are known when the rule loads"}
		}
		refs.dynChildren = dynamicAt >= 0
	}
	refs.lookups, refs.dynLookupsAt = references(parsed, src, varLookups)
	if refs.dynLookupsAt >= 0 && scope.InLookup {
		return refs, &Error{Offset: refs.dynLookupsAt, Msg: "lookups must be followed by a lookup id here, as in lookups.settings: " +
			"the order a rule's lookups are read in is known when it loads"}
	}
	return refs, nil
}

func issueError(src string, iss *cel.Issues) *Error {
	e := iss.Errors()[0]
	msg := strings.TrimSuffix(e.Message, " (in container '')")
	return &Error{Offset: offsetOf(src, e.Location.Line(), e.Location.Column()), Msg: msg}
}

var undefinedField = regexp.MustCompile(`^undefined field '([^']*)'$`)

// checkError is the checker's first error. An undefined field names the
// type that lacks it and the fields it has that are closest.
func (c *Compiler) checkError(src string, iss *cel.Issues, prov *provider) *Error {
	err := issueError(src, iss)
	m := undefinedField.FindStringSubmatch(err.Msg)
	if m == nil || prov == nil {
		return err
	}
	prov.mu.Lock()
	t, field := prov.missed.t, prov.missed.field
	prov.mu.Unlock()
	if t == nil || field != m[1] {
		return err
	}
	err.Msg = fmt.Sprintf("%s has no field %q", t.name, field)
	if near := Suggest(field, t.FieldNames()); near != "" {
		err.Msg += fmt.Sprintf(" (did you mean %q?)", near)
	}
	// The checker places a select at its dot: point at the field.
	if err.Offset >= 0 && err.Offset < len(src) {
		if i := strings.Index(src[err.Offset:], field); i >= 0 {
			err.Offset += i
		}
	}
	return err
}

func checkResult(t *types.Type, want Result) error {
	k := t.Kind()
	if k == types.DynKind || k == types.AnyKind || want == AnyResult {
		return nil
	}
	ok := false
	switch want {
	case BoolResult:
		ok = k == types.BoolKind
	case ListResult:
		ok = k == types.ListKind
	case StringResult:
		ok = k == types.StringKind
	}
	if !ok {
		what := t.String()
		if k == types.StructKind {
			what = "an object (" + what + ")"
		}
		return &Error{Offset: -1, Msg: fmt.Sprintf("must produce a %s, but produces %s", want, what)}
	}
	return nil
}

// checkReferences rejects `name.x`, `name['x']` and `has(name.x)` where x is
// not one of declared: the names inside `variables` and `children` are known
// when the rule loads, so a typo is a load error, not a reconcile error.
func checkReferences(checked *cel.Ast, src, name, what string, declared []string) error {
	known := make(map[string]bool, len(declared))
	for _, d := range declared {
		known[d] = true
	}
	a := checked.NativeRep()
	var found error
	ast.PreOrderVisit(ast.NavigateAST(a), ast.NewExprVisitor(func(e ast.Expr) {
		if found != nil {
			return
		}
		operand, field, ok := selection(e)
		if !ok {
			return
		}
		if operand.Kind() != ast.IdentKind || operand.AsIdent() != name || known[field] {
			return
		}
		loc := a.SourceInfo().GetStartLocation(e.ID())
		off := offsetOf(src, loc.Line(), loc.Column())
		// CEL places a select at its dot, and macros such as has() at their
		// start: point at the field name itself where the text shows it.
		for _, form := range []string{name + ".", name + ".?", name + "['", name + "[\"", name + "[?'", name + "[?\""} {
			if i := strings.Index(src, form+field); i >= 0 {
				off = i + len(form)
				break
			}
		}
		msg := fmt.Sprintf("undeclared %s %q", what, field)
		if len(declared) > 0 {
			sorted := append([]string(nil), declared...)
			sort.Strings(sorted)
			msg += fmt.Sprintf(" (declared: %s)", strings.Join(sorted, ", "))
		} else {
			msg += fmt.Sprintf(" (no %ss are declared here)", what)
		}
		found = &Error{Offset: off, Msg: msg}
	}))
	return found
}

// outOfScope reports the first use of a name the rule's environment
// declares but scope does not have: item and index outside forEach,
// children where no resource may be read, ready and clusters outside the
// status.
// Names bound by a comprehension (x.map(item, …)) are the comprehension's.
func outOfScope(parsed *cel.Ast, src string, scope Scope) error {
	absent := map[string]bool{varItem: !scope.ForEach, varIndex: !scope.ForEach,
		varChildren: scope.Children == nil, varReady: !scope.Status, varCluster: !scope.Cluster, varClusters: !scope.Status,
		varObject: scope.ClusterOnly, varVariables: scope.ClusterOnly, varLookups: scope.ClusterOnly}
	a := parsed.NativeRep()
	var found error
	var walk func(e ast.Expr, bound map[string]bool)
	walk = func(e ast.Expr, bound map[string]bool) {
		if found != nil {
			return
		}
		switch e.Kind() {
		case ast.IdentKind:
			if name := e.AsIdent(); absent[name] && !bound[name] {
				loc := a.SourceInfo().GetStartLocation(e.ID())
				msg := fmt.Sprintf("undeclared reference to '%s'", name)
				switch name {
				case varCluster:
					msg += ": cluster is known in a resource that targets clusters (clusters:), in its forEach and template"
				case varClusters:
					msg += ": clusters (what is where in the clusters of the fleet) is known in the status"
				case varObject, varVariables, varLookups:
					msg += ": a rollout's cluster steps read cluster (name, labels) alone, the same for every trigger"
				}
				found = &Error{Offset: offsetOf(src, loc.Line(), loc.Column()), Msg: msg}
			}
		case ast.SelectKind:
			walk(e.AsSelect().Operand(), bound)
		case ast.CallKind:
			call := e.AsCall()
			if call.IsMemberFunction() {
				walk(call.Target(), bound)
			}
			for _, arg := range call.Args() {
				walk(arg, bound)
			}
		case ast.ListKind:
			for _, el := range e.AsList().Elements() {
				walk(el, bound)
			}
		case ast.MapKind:
			for _, en := range e.AsMap().Entries() {
				walk(en.AsMapEntry().Key(), bound)
				walk(en.AsMapEntry().Value(), bound)
			}
		case ast.StructKind:
			for _, f := range e.AsStruct().Fields() {
				walk(f.AsStructField().Value(), bound)
			}
		case ast.ComprehensionKind:
			comp := e.AsComprehension()
			walk(comp.IterRange(), bound)
			walk(comp.AccuInit(), bound)
			inner := map[string]bool{comp.IterVar(): true, comp.AccuVar(): true}
			if comp.HasIterVar2() {
				inner[comp.IterVar2()] = true
			}
			for k := range bound {
				inner[k] = true
			}
			walk(comp.LoopCondition(), inner)
			walk(comp.LoopStep(), inner)
			walk(comp.Result(), inner)
		}
	}
	walk(a.Expr(), map[string]bool{})
	return found
}

// indexToSelect rewrites name['x'] into name.x and name[?'x'] into
// name.?x, so that the checker types them as the struct's field x.
func indexToSelect(parsed *cel.Ast, name string) {
	var found []ast.Expr
	ast.PreOrderVisit(ast.NavigateAST(parsed.NativeRep()), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() != ast.CallKind {
			return
		}
		switch e.AsCall().FunctionName() {
		case "_[_]", "_[?_]":
			if operand, _, ok := selection(e); ok && operand.Kind() == ast.IdentKind && operand.AsIdent() == name {
				found = append(found, e)
			}
		}
	}))
	fac := ast.NewExprFactory()
	for _, e := range found {
		call := e.AsCall()
		operand, field := call.Args()[0], call.Args()[1]
		if call.FunctionName() == "_[_]" {
			e.SetKindCase(fac.NewSelect(e.ID(), operand, string(field.AsLiteral().(types.String))))
		} else {
			e.SetKindCase(fac.NewCall(e.ID(), "_?._", operand, field))
		}
	}
}

// selection recognises the ways an expression reads a literal field of a
// value: x.f, has(x.f), x['f'], and the optional x.?f and x[?'f']. It
// returns the operand and the field.
func selection(e ast.Expr) (operand ast.Expr, field string, ok bool) {
	switch e.Kind() {
	case ast.SelectKind:
		return e.AsSelect().Operand(), e.AsSelect().FieldName(), true
	case ast.CallKind:
		call := e.AsCall()
		switch call.FunctionName() {
		case "_[_]", "_?._", "_[?_]":
		default:
			return nil, "", false
		}
		if len(call.Args()) != 2 || call.Args()[1].Kind() != ast.LiteralKind {
			return nil, "", false
		}
		s, isString := call.Args()[1].AsLiteral().(types.String)
		if !isString {
			return nil, "", false
		}
		return call.Args()[0], string(s), true
	}
	return nil, "", false
}

// references returns the fields read of the variable name with a literal
// field (name.x, name['x'], name.?x), sorted and without duplicates, and the
// byte offset of a use of name that reads no literal field (the whole map
// passed on, or indexed by a computed key), or -1 when there is none.
func references(checked *cel.Ast, src, name string) ([]string, int) {
	a := checked.NativeRep()
	seen := map[string]bool{}
	consumed := map[int64]bool{} // ident nodes read with a literal field
	var refs []string
	ast.PreOrderVisit(ast.NavigateAST(a), ast.NewExprVisitor(func(e ast.Expr) {
		operand, field, ok := selection(e)
		if !ok || operand.Kind() != ast.IdentKind || operand.AsIdent() != name {
			return
		}
		consumed[operand.ID()] = true
		if !seen[field] {
			seen[field] = true
			refs = append(refs, field)
		}
	}))
	dynamicAt := -1
	ast.PreOrderVisit(ast.NavigateAST(a), ast.NewExprVisitor(func(e ast.Expr) {
		if dynamicAt >= 0 || e.Kind() != ast.IdentKind || e.AsIdent() != name || consumed[e.ID()] {
			return
		}
		loc := a.SourceInfo().GetStartLocation(e.ID())
		dynamicAt = offsetOf(src, loc.Line(), loc.Column())
	}))
	sort.Strings(refs)
	return refs, dynamicAt
}

// offsetOf converts CEL's 1-based line and 0-based column (in code points)
// into a byte offset into src; -1 if out of range.
func offsetOf(src string, line, col int) int {
	if line < 1 {
		return -1
	}
	off := 0
	for l := 1; l < line; l++ {
		i := strings.IndexByte(src[off:], '\n')
		if i < 0 {
			return -1
		}
		off += i + 1
	}
	for col > 0 && off < len(src) {
		r, size := utf8.DecodeRuneInString(src[off:])
		if r == '\n' {
			break
		}
		off += size
		col--
	}
	return off
}
