package expr

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/kube-openapi/pkg/validation/spec"
)

// Template is a compiled ${} template: a tree of maps, lists and scalars in
// which strings may hold CEL expressions. It is immutable and safe for
// concurrent use; each Render builds a new tree.
//
// The semantics, for every string in the tree:
//   - exactly "${expr}": the expression's value, of any type; nil removes the
//     map field or list item it stands for;
//   - text around ${...} parts: string interpolation, each part a string,
//     number or bool;
//   - "$${" is a literal "${";
//   - map keys may hold ${...} too and must give strings.
//
// A null written literally in the template also removes its field.
type Template struct {
	root node
	n    int // expressions compiled
	refs []ChildRef
	// lookupRefs and variableRefs are the lookup ids and variables its
	// expressions read, sorted.
	lookupRefs, variableRefs []string
	// outputs are the programs of the strings that are a sole ${expr},
	// by path (Path.String()).
	outputs map[string]*Program
	// vt convert the activation's values for typed programs; nil: untyped.
	vt *valueTypes
}

// OutputAt is the type of the value at path when its string is a sole
// ${expr}; false for other strings.
func (t *Template) OutputAt(path Path) (OutputType, bool) {
	p, ok := t.outputs[path.String()]
	if !ok {
		return TypeDyn, false
	}
	return p.Output(), true
}

// SchemaAt is the schema of the value at path when its string is a sole
// ${expr} of a status template (Program.OutputSchema); false for other
// strings.
func (t *Template) SchemaAt(path Path) (s *spec.Schema, exact, ok bool) {
	p, ok := t.outputs[path.String()]
	if !ok {
		return nil, false, false
	}
	s, exact = p.OutputSchema()
	return s, exact, true
}

// Path locates a value in a template tree: map keys (string) and list
// indexes (int), outermost first.
type Path []any

func (p Path) String() string {
	var b strings.Builder
	for _, e := range p {
		switch e := e.(type) {
		case int:
			fmt.Fprintf(&b, "[%d]", e)
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e)
		}
	}
	return b.String()
}

// With returns a new path one element deeper.
func (p Path) With(e any) Path { return append(append(Path(nil), p...), e) }

// TemplateError is a compile error at Path. Key is true when the error is in
// the map key at Path rather than its value; Offset is the byte offset in
// that string, or -1.
type TemplateError struct {
	Path   Path
	Key    bool
	Offset int
	Msg    string
}

func (e *TemplateError) Error() string {
	if len(e.Path) == 0 {
		return e.Msg
	}
	return e.Path.String() + ": " + e.Msg
}

// RenderError is an evaluation error at Path, from the expression Expr.
type RenderError struct {
	Path Path
	Expr string
	Err  error
}

func (e *RenderError) Error() string {
	where := e.Path.String()
	if where != "" {
		where += ": "
	}
	if e.Expr == "" { // the template's own structure, not an expression
		return fmt.Sprintf("%s%v", where, e.Err)
	}
	return fmt.Sprintf("%s${%s}: %v", where, e.Expr, e.Err)
}

func (e *RenderError) Unwrap() error { return e.Err }

// CompileTemplate compiles a tree of Go values as decoded from YAML. It
// returns every error found, not only the first.
func (c *Compiler) CompileTemplate(v any, scope Scope) (*Template, []*TemplateError) {
	t := &Template{}
	if scope.typed() {
		t.vt = scope.valueTypes()
	}
	var errs []*TemplateError
	t.root = c.compileNode(v, nil, scope, t, &errs)
	if len(errs) > 0 {
		return nil, errs
	}
	return t, nil
}

// Expressions is how many CEL expressions the template holds.
func (t *Template) Expressions() int { return t.n }

// Render evaluates the template. A nil result means the whole template
// evaluated to null.
func (t *Template) Render(ctx context.Context, a *Activation) (any, error) {
	return t.root.render(ctx, &state{a: a, vars: a.vars(t.vt)})
}

// ChildRef is a children.<id> reference in a template, and where.
type ChildRef struct {
	ID   string
	Path Path
}

// ChildRefs are the template's children.<id> references, in template
// order: its dependencies.
func (t *Template) ChildRefs() []ChildRef { return t.refs }

// LookupRefs are the lookup ids the template reads as lookups.<id>,
// sorted and without duplicates.
func (t *Template) LookupRefs() []string { return t.lookupRefs }

// VariableRefs are the variables the template reads, sorted and without
// duplicates.
func (t *Template) VariableRefs() []string { return t.variableRefs }

// state is what one render of a template sees.
type state struct {
	a    *Activation
	vars *bindings // a's values as the programs see them
}

type node interface {
	render(ctx context.Context, st *state) (any, error)
}

func (c *Compiler) compileNode(v any, path Path, scope Scope, t *Template, errs *[]*TemplateError) node {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		m := &mapNode{entries: make([]mapEntry, 0, len(v)), path: path}
		for _, k := range keys {
			p := path.With(k)
			key, err := c.compileString(k, p, scope, t, AnyResult)
			if err != nil {
				err.Key = true
				*errs = append(*errs, err)
				continue
			}
			if whole, ok := key.(*exprNode); ok {
				key = &interpNode{parts: []part{{prog: whole.prog}}, path: p, stringOnly: true}
			}
			m.entries = append(m.entries, mapEntry{key: key, val: c.compileNode(v[k], p, scope, t, errs)})
		}
		return m
	case []any:
		l := &listNode{items: make([]node, 0, len(v)), path: path}
		for i, e := range v {
			l.items = append(l.items, c.compileNode(e, path.With(i), scope, t, errs))
		}
		return l
	case string:
		n, err := c.compileString(v, path, scope, t, AnyResult)
		if err != nil {
			*errs = append(*errs, err)
			return constNode{}
		}
		return n
	case nil, bool, int64, float64:
		return constNode{v: v}
	case int:
		return constNode{v: int64(v)}
	default:
		*errs = append(*errs, &TemplateError{Path: path, Offset: -1, Msg: fmt.Sprintf("unsupported value of type %T", v)})
		return constNode{}
	}
}

// compileString compiles one string: a constant, a whole ${expr}, or an
// interpolation.
// CompileString compiles one template string whose value must be a string,
// such as a lookup's name: a sole ${expr} must produce a string (or dyn,
// checked when rendered); interpolated parts are strings anyway.
func (c *Compiler) CompileString(s string, scope Scope) (*Template, *TemplateError) {
	t := &Template{}
	if scope.typed() {
		t.vt = scope.valueTypes()
	}
	root, err := c.compileString(s, nil, scope, t, StringResult)
	if err != nil {
		return nil, err
	}
	t.root = root
	return t, nil
}

// compileString compiles one string of a template; a sole ${expr} must
// produce want.
func (c *Compiler) compileString(s string, path Path, scope Scope, t *Template, want Result) (node, *TemplateError) {
	segs, err := splitTemplate(s)
	if err != nil {
		return nil, &TemplateError{Path: path, Offset: err.Offset, Msg: err.Msg}
	}
	if len(segs) == 1 && !segs[0].isExpr {
		return constNode{v: segs[0].text}, nil
	}
	if len(segs) > 1 {
		want = AnyResult
	}
	parts := make([]part, 0, len(segs))
	for _, sg := range segs {
		if !sg.isExpr {
			parts = append(parts, part{lit: sg.text})
			continue
		}
		prog, err := c.Compile(sg.text, scope, want)
		if err != nil {
			ce := err.(*Error)
			off := sg.offset
			if ce.Offset >= 0 {
				off += ce.Offset
			}
			return nil, &TemplateError{Path: path, Offset: off, Msg: fmt.Sprintf("${%s}: %s", sg.text, ce.Msg)}
		}
		t.n++
		for _, id := range prog.childRefs {
			t.refs = append(t.refs, ChildRef{ID: id, Path: path})
		}
		t.lookupRefs = union(t.lookupRefs, prog.lookupRefs)
		t.variableRefs = union(t.variableRefs, prog.variableRefs)
		parts = append(parts, part{prog: prog})
	}
	if len(parts) == 1 {
		if t.outputs == nil {
			t.outputs = map[string]*Program{}
		}
		t.outputs[path.String()] = parts[0].prog
		return &exprNode{prog: parts[0].prog, path: path}, nil
	}
	return &interpNode{parts: parts, path: path}, nil
}

// segment is a piece of a template string: literal text or an expression
// found at byte offset in the string.
type segment struct {
	text   string
	isExpr bool
	offset int
}

// splitTemplate cuts s into literal and ${...} segments. The end of an
// expression is the first "}" that closes it, skipping braces inside CEL map
// literals and string literals.
func splitTemplate(s string) ([]segment, *Error) {
	var segs []segment
	var lit strings.Builder
	flush := func() {
		if lit.Len() > 0 {
			segs = append(segs, segment{text: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "$${"):
			lit.WriteString("${")
			i += 3
		case strings.HasPrefix(s[i:], "${"):
			end, err := scanExpression(s, i+2)
			if err != nil {
				return nil, err
			}
			if strings.TrimSpace(s[i+2:end]) == "" {
				return nil, &Error{Offset: i, Msg: "empty ${}"}
			}
			flush()
			segs = append(segs, segment{text: s[i+2 : end], isExpr: true, offset: i + 2})
			i = end + 1
		default:
			lit.WriteByte(s[i])
			i++
		}
	}
	flush()
	if len(segs) == 0 {
		segs = append(segs, segment{})
	}
	return segs, nil
}

// scanExpression returns the index of the "}" that ends the expression
// starting at start.
func scanExpression(s string, start int) (int, *Error) {
	depth := 0
	for j := start; j < len(s); j++ {
		switch c := s[j]; c {
		case '\'', '"':
			end, ok := skipStringLiteral(s, start, j)
			if !ok {
				return 0, &Error{Offset: j, Msg: "unterminated string literal in ${}"}
			}
			j = end
		case '{':
			depth++
		case '}':
			if depth == 0 {
				return j, nil
			}
			depth--
		}
	}
	return 0, &Error{Offset: start - 2, Msg: "unterminated ${: missing }"}
}

// skipStringLiteral returns the index of the closing quote of the CEL string
// literal whose opening quote is at q: single, double or triple quoted, raw
// when prefixed with r or R.
func skipStringLiteral(s string, exprStart, q int) (int, bool) {
	raw := false
	for k := q - 1; k >= exprStart && k >= q-2; k-- {
		c := s[k]
		if c == 'r' || c == 'R' {
			raw = true
		}
		if !strings.ContainsRune("rRbB", rune(c)) {
			break
		}
	}
	quote := s[q : q+1]
	if strings.HasPrefix(s[q:], strings.Repeat(quote, 3)) {
		quote = strings.Repeat(quote, 3)
	}
	for j := q + len(quote); j < len(s); j++ {
		if !raw && s[j] == '\\' {
			j++
			continue
		}
		if strings.HasPrefix(s[j:], quote) {
			return j + len(quote) - 1, true
		}
		if len(quote) == 1 && s[j] == '\n' {
			return 0, false
		}
	}
	return 0, false
}

type constNode struct{ v any }

func (n constNode) render(context.Context, *state) (any, error) { return n.v, nil }

type exprNode struct {
	prog *Program
	path Path
}

func (n *exprNode) render(ctx context.Context, st *state) (any, error) {
	v, err := n.prog.eval(ctx, st.a, st.vars)
	if err != nil && st.a.Offline && n.prog.Unknown(err) {
		return Unknown(n.prog.src), nil
	}
	if err != nil {
		return nil, &RenderError{Path: n.path, Expr: n.prog.src, Err: err}
	}
	out, err := toNative(v, st.a.Budget)
	if err != nil {
		return nil, &RenderError{Path: n.path, Expr: n.prog.src, Err: err}
	}
	return out, nil
}

type part struct {
	lit  string
	prog *Program // nil for literal text
}

type interpNode struct {
	parts []part
	path  Path
	// stringOnly: a map key that is exactly ${expr} must give a string.
	stringOnly bool
}

func (n *interpNode) render(ctx context.Context, st *state) (any, error) {
	var b strings.Builder
	for _, p := range n.parts {
		if p.prog == nil {
			b.WriteString(p.lit)
			continue
		}
		v, err := p.prog.eval(ctx, st.a, st.vars)
		if err != nil && st.a.Offline && p.prog.Unknown(err) {
			b.WriteString(Unknown(p.prog.src))
			continue
		}
		if err != nil {
			return nil, &RenderError{Path: n.path, Expr: p.prog.src, Err: err}
		}
		native, err := toNative(v, st.a.Budget)
		if err != nil {
			return nil, &RenderError{Path: n.path, Expr: p.prog.src, Err: err}
		}
		if _, isString := native.(string); n.stringOnly && !isString {
			return nil, &RenderError{Path: n.path, Expr: p.prog.src,
				Err: fmt.Errorf("a map key must give a string, gave %s", describe(native))}
		}
		switch x := native.(type) {
		case string:
			b.WriteString(x)
		case bool:
			b.WriteString(strconv.FormatBool(x))
		case int64:
			b.WriteString(strconv.FormatInt(x, 10))
		case float64:
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		default:
			return nil, &RenderError{Path: n.path, Expr: p.prog.src,
				Err: fmt.Errorf("interpolated into a string, must give a string, number or bool, gave %s", describe(native))}
		}
	}
	return b.String(), st.a.Budget.spend(int64(b.Len()))
}

type mapEntry struct {
	key node // constNode or *interpNode: always a string
	val node
}

type mapNode struct {
	entries []mapEntry
	path    Path
}

func (n *mapNode) render(ctx context.Context, st *state) (any, error) {
	if err := st.a.Budget.spend(mapCost + int64(len(n.entries))*entryCost); err != nil {
		return nil, &RenderError{Path: n.path, Err: err}
	}
	out := make(map[string]any, len(n.entries))
	for _, e := range n.entries {
		k, err := e.key.render(ctx, st)
		if err != nil {
			return nil, err
		}
		v, err := e.val.render(ctx, st)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		ks := k.(string)
		if _, dup := out[ks]; dup {
			return nil, &RenderError{Path: n.path.With(ks), Expr: keyExpr(e.key), Err: fmt.Errorf("key %q rendered twice", ks)}
		}
		out[ks] = v
	}
	return out, nil
}

type listNode struct {
	items []node
	path  Path
}

func (n *listNode) render(ctx context.Context, st *state) (any, error) {
	if err := st.a.Budget.spend(listCost + int64(len(n.items))*elemCost); err != nil {
		return nil, &RenderError{Path: n.path, Err: err}
	}
	out := make([]any, 0, len(n.items))
	for _, it := range n.items {
		v, err := it.render(ctx, st)
		if err != nil {
			return nil, err
		}
		if v != nil {
			out = append(out, v)
		}
	}
	return out, nil
}

// keyExpr is the first expression of a templated key, for error messages.
func keyExpr(n node) string {
	if in, ok := n.(*interpNode); ok {
		for _, p := range in.parts {
			if p.prog != nil {
				return p.prog.src
			}
		}
	}
	return ""
}

func describe(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "a map"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%T", v)
}

// Keys are the literal keys of a template that is a map: the fields it
// always renders or removes.
func (t *Template) Keys() []string {
	m, ok := t.root.(*mapNode)
	if !ok {
		return nil
	}
	var keys []string
	for _, e := range m.entries {
		if k, ok := e.key.(constNode); ok {
			if s, ok := k.v.(string); ok {
				keys = append(keys, s)
			}
		}
	}
	return keys
}

// union adds the sorted names of more to the sorted set names.
func union(names, more []string) []string {
	for _, n := range more {
		if i, found := slices.BinarySearch(names, n); !found {
			names = slices.Insert(names, i, n)
		}
	}
	return names
}
