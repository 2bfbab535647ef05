package rules

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// Bounds on one rule document, so that a "billion laughs" or a deeply nested
// document is an error, not an outage: the values it may expand to (aliases
// included) and how deep mappings and lists may nest.
const (
	maxNodes = 200_000
	maxDepth = 100
)

// decoder walks the YAML nodes of one rule document against the schema,
// collecting every error with its position rather than stopping at the first.
type decoder struct {
	file  string
	lines []string // the file's source lines, for positions inside block scalars
	rule  string   // the rule's name once known
	errs  ErrorList
	warns ErrorList // what may still work: required fields a template lacks
	notes ErrorList // kinds with no schema
	nodes int       // values produced so far, aliases expanded
	// expanding holds the anchors whose alias is being expanded, to catch
	// an anchor that contains an alias to itself.
	expanding map[*yaml.Node]bool
	// settings are the loader's; schemas and scopes also know the kinds
	// the rule's file defines.
	settings
	// at is where every value and key of the document was written (posKey),
	// for the schema checks' errors; dropped with the decoder.
	at map[string]Pos
}

// settings are what a Loader decides for every rule it decodes.
type settings struct {
	// schemas checks templates; nil: no checks.
	schemas kinds.Source
	// scopes knows which kinds are namespaced; nil: no scope checks.
	scopes ScopeSource
	// installation is the installation the rules act for; crds, when not
	// nil, the cluster's CRDs that the kind a rule defines is checked
	// against (Loader.UseServedCRDs), and manageCRDs whether syncloop
	// keeps them.
	installation string
	crds         CRDSource
	manageCRDs   bool
	identities   identities
	tenant       string // the namespace a tenant rule is confined to (Loader.ForTenant)
	// webhook is where the API server reaches syncloop to convert the
	// kinds rules define (Loader.SetConversionWebhook).
	webhook ConversionWebhook
	// functions compiles and keeps the modules of function steps;
	// fromRevision: the rules are revisions, whose modules are found by
	// digest (Loader.ForRevisions).
	functions    *functionStore
	fromRevision bool
	// absentModules: a revision whose module is not loaded still compiles,
	// its function unable to run (Loader.ForInspection).
	absentModules bool
}

func (d *decoder) pos(n *yaml.Node) Pos {
	return Pos{File: d.file, Line: n.Line, Column: n.Column}
}

func (d *decoder) errorAt(p Pos, field, format string, args ...any) {
	d.errs = append(d.errs, &Error{Pos: p, Rule: d.rule, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) errorf(n *yaml.Node, field, format string, args ...any) {
	d.errorAt(d.pos(n), field, format, args...)
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return "a string"
		case "!!int", "!!float":
			return "a number"
		case "!!bool":
			return "a bool"
		}
		return "a scalar"
	}
	return "an unknown node"
}

// fields checks that n is a mapping whose keys are all in known (strict
// decoding: an unknown or repeated key is an error at the key) and returns
// the value node of each key present.
func (d *decoder) fields(n *yaml.Node, field string, known ...string) map[string]*yaml.Node {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		d.errorf(n, field, "must be a mapping, not %s", kindName(n))
		return nil
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, field, "keys must be strings")
			continue
		}
		name := k.Value
		if _, dup := out[name]; dup {
			continue // reported when the document was read (decoder.value)
		}
		if !contains(known, name) {
			msg := fmt.Sprintf("unknown field %q", name)
			if s := expr.Suggest(name, known); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.errorf(k, field, "%s", msg)
			continue
		}
		out[name] = v
	}
	return out
}

// str decodes a string scalar. A number or bool where a string belongs is an
// error (quote it), as is null.
func (d *decoder) str(n *yaml.Node, field string) (string, bool) {
	n = resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		d.errorf(n, field, "must be a string, not %s", kindName(n))
		return "", false
	}
	return n.Value, true
}

func (d *decoder) integer(n *yaml.Node, field string) (int64, bool) {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" {
		var v int64
		if err := n.Decode(&v); err == nil {
			return v, true
		}
	}
	d.errorf(n, field, "must be an integer, not %s", describeScalar(n))
	return 0, false
}

func (d *decoder) number(n *yaml.Node, field string) (float64, bool) {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		var v float64
		if err := n.Decode(&v); err == nil && !math.IsNaN(v) && !math.IsInf(v, 0) {
			return v, true
		}
	}
	d.errorf(n, field, "must be a number, not %s", describeScalar(n))
	return 0, false
}

func (d *decoder) boolean(n *yaml.Node, field string) (bool, bool) {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" {
		var v bool
		if err := n.Decode(&v); err == nil {
			return v, true
		}
	}
	d.errorf(n, field, "must be true or false, not %s", describeScalar(n))
	return false, false
}

func (d *decoder) seq(n *yaml.Node, field string) []*yaml.Node {
	n = resolve(n)
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, field, "must be a list, not %s", kindName(n))
		return nil
	}
	return n.Content
}

func describeScalar(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return strconv.Quote(n.Value)
	}
	return kindName(n)
}

// value converts a node into a template tree: map[string]any, []any,
// string, int64, float64, bool, nil. Positions of strings that hold "${"
// (values and keys) are recorded under their path, for errors.
func (d *decoder) value(n *yaml.Node, path expr.Path, field string, pos positions) (any, bool) {
	d.nodes++
	if d.nodes > maxNodes {
		if d.nodes == maxNodes+1 {
			d.errorf(n, field, "document too large: more than %d values (aliases expanded)", maxNodes)
		}
		return nil, false
	}
	if len(path) > maxDepth {
		d.errorf(n, PathField(field, path[:maxDepth]), "nested more than %d levels deep", maxDepth)
		return nil, false
	}
	if d.at == nil {
		d.at = map[string]Pos{}
	}
	d.at[posKey(path, false)] = d.pos(n)
	if n.Kind == yaml.AliasNode {
		target := resolve(n)
		if d.expanding[target] {
			d.errorf(n, PathField(field, path), "alias *%s refers to a value that contains it", n.Value)
			return nil, false
		}
		if d.expanding == nil {
			d.expanding = map[*yaml.Node]bool{}
		}
		d.expanding[target] = true
		defer delete(d.expanding, target)
		n = target
	}
	switch n.Kind {
	case yaml.MappingNode:
		return d.mapping(n, path, field, pos)
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		ok := true
		for i, e := range n.Content {
			v, eok := d.value(e, path.With(i), field, pos)
			ok = ok && eok
			l = append(l, v)
		}
		return l, ok
	case yaml.ScalarNode:
		return d.scalar(n, path, field, pos)
	}
	d.errorf(n, PathField(field, path), "unsupported YAML node")
	return nil, false
}

// mapping is value for a mapping node: string keys, once each, no merge
// keys.
func (d *decoder) mapping(n *yaml.Node, path expr.Path, field string, pos positions) (any, bool) {
	m := make(map[string]any, len(n.Content)/2)
	ok := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, PathField(field, path), "keys must be strings")
			ok = false
			continue
		}
		if k.Tag == "!!merge" || (k.Value == "<<" && k.Style == 0) {
			d.errorf(k, PathField(field, path), "YAML merge keys (<<) are not supported")
			ok = false
			continue
		}
		if _, dup := m[k.Value]; dup {
			d.errorf(k, PathField(field, path.With(k.Value)), "key given twice")
			ok = false
			continue
		}
		p := path.With(k.Value)
		d.at[posKey(p, true)] = d.pos(k)
		if strings.Contains(k.Value, "${") {
			pos.add(p, true, d.pos(k), k)
		}
		v, vok := d.value(n.Content[i+1], p, field, pos)
		ok = ok && vok
		m[k.Value] = v
	}
	return m, ok
}

// scalar is value for a scalar node: null, a bool, a 64-bit integer, a
// JSON number or a string.
func (d *decoder) scalar(n *yaml.Node, path expr.Path, field string, pos positions) (any, bool) {
	switch n.ShortTag() {
	case "!!null":
		return nil, true
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err == nil {
			return b, true
		}
	case "!!int":
		var i int64
		if err := n.Decode(&i); err == nil {
			return i, true
		}
		d.errorf(n, PathField(field, path), "integer %s does not fit 64 bits", n.Value)
		return nil, false
	case "!!float":
		var f float64
		if err := n.Decode(&f); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return f, true
		}
		d.errorf(n, PathField(field, path), "%s is not a JSON number", n.Value)
		return nil, false
	}
	if strings.Contains(n.Value, "${") {
		pos.add(path, false, d.pos(n), n)
	}
	return n.Value, true
}

// positions maps template paths to where their strings stand in the file,
// so that errors found later — compiling ${} or rendering — name the line.
type positions map[string]scalarPos

type scalarPos struct {
	pos  Pos
	node *yaml.Node // for offsets inside the string; dropped after load
}

func posKey(p expr.Path, key bool) string {
	if key {
		return p.String() + "\x00key"
	}
	return p.String()
}

func (ps positions) add(p expr.Path, key bool, pos Pos, n *yaml.Node) {
	ps[posKey(p, key)] = scalarPos{pos: pos, node: n}
}

// PathField joins a schema field and a template path:
// spec.resources[0].template + metadata.name.
func PathField(field string, p expr.Path) string {
	s := p.String()
	if s == "" {
		return field
	}
	if strings.HasPrefix(s, "[") {
		return field + s
	}
	return JoinField(field, s)
}

// JoinField is field.name, or name alone at the top.
func JoinField(field, name string) string {
	if field == "" {
		return name
	}
	if name == "" {
		return field
	}
	return field + "." + name
}

// offsetPos returns the position of byte offset off inside the string value
// of scalar n: exact for plain and quoted single-line strings and for literal
// block scalars (|); the scalar's own position otherwise.
func (d *decoder) offsetPos(n *yaml.Node, off int) Pos {
	p := d.pos(n)
	if off < 0 || off > len(n.Value) {
		return p
	}
	before := n.Value[:off]
	switch n.Style {
	case 0, yaml.SingleQuotedStyle, yaml.DoubleQuotedStyle:
		start := p.Column - 1 // in runes, 0-based
		if n.Style != 0 {
			start++ // past the opening quote
		}
		// Exact only when the source line shows the value's text verbatim up
		// to off: no escapes, no folding of a scalar over several lines.
		if !d.sourceShows(n.Line, start, before) {
			return p
		}
		p.Column = start + utf8.RuneCountInString(before) + 1
		return p
	case yaml.LiteralStyle:
		k := strings.Count(before, "\n")
		lineInValue := before[strings.LastIndexByte(before, '\n')+1:]
		srcLine := n.Line + 1 + k
		if srcLine-1 >= len(d.lines) {
			return p
		}
		src := d.lines[srcLine-1]
		full := strings.SplitN(n.Value, "\n", k+2)[k]
		indent := utf8.RuneCountInString(src) - utf8.RuneCountInString(full)
		if indent < 0 {
			return p
		}
		return Pos{File: d.file, Line: srcLine, Column: indent + utf8.RuneCountInString(lineInValue) + 1}
	}
	return p
}

// sourceShows reports whether source line `line` holds text starting at rune
// column col (0-based).
func (d *decoder) sourceShows(line, col int, text string) bool {
	if line < 1 || line > len(d.lines) || strings.Contains(text, "\n") {
		return false
	}
	src := []rune(d.lines[line-1])
	if col > len(src) {
		return false
	}
	return strings.HasPrefix(string(src[col:]), text)
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// oneOf decodes a string that must be one of values.
func (d *decoder) oneOf(n *yaml.Node, field string, values ...string) (string, bool) {
	v, ok := d.str(n, field)
	if !ok {
		return "", false
	}
	if contains(values, v) {
		return v, true
	}
	d.errorf(n, field, "must be %s or %s, not %q", strings.Join(values[:len(values)-1], ", "), values[len(values)-1], v)
	return "", false
}

// id decodes the required id of a resource or lookup (what): a DNS-1123
// label not among ids. It returns "" when there is an error.
func (d *decoder) id(parent *yaml.Node, f map[string]*yaml.Node, field, what string, ids []string) string {
	nn, ok := f["id"]
	if !ok {
		d.errorf(parent, field+".id", "required")
		return ""
	}
	id, ok := d.str(nn, field+".id")
	switch {
	case !ok:
		return ""
	case len(validation.IsDNS1123Label(id)) > 0:
		d.errorf(nn, field+".id", "%q is not a valid %s id: %s", id, what, strings.Join(validation.IsDNS1123Label(id), "; "))
		return ""
	case contains(ids, id):
		d.errorf(nn, field+".id", "%s id %q used twice in this rule", what, id)
		return ""
	}
	return id
}

// expression compiles a CEL expression written as a YAML string.
func (d *decoder) expression(n *yaml.Node, field string, c *expr.Compiler, scope expr.Scope, want expr.Result) *Expression {
	src, ok := d.str(n, field)
	if !ok {
		return nil
	}
	n = resolve(n)
	prog, err := c.Compile(src, scope, want)
	if err != nil {
		ce, _ := err.(*expr.Error)
		off := -1
		msg := err.Error()
		if ce != nil {
			off, msg = ce.Offset, ce.Msg
		}
		d.errorAt(d.offsetPos(n, off), field, "%s", msg)
		return nil
	}
	return &Expression{Program: prog, Pos: d.pos(n), Field: field}
}

// template compiles the template at prefix in the document. Its strings'
// positions come from the document-wide positions map.
func (d *decoder) template(n *yaml.Node, prefix expr.Path, docVal any, pos positions, c *expr.Compiler, scope expr.Scope) *Template {
	val := lookup(docVal, prefix)
	t, errs := c.CompileTemplate(val, scope)
	field := PathField("", prefix)
	for _, e := range errs {
		full := append(append(expr.Path(nil), prefix...), e.Path...)
		p := d.pos(resolve(n))
		if sp, ok := pos[posKey(full, e.Key)]; ok {
			p = d.offsetPos(sp.node, e.Offset)
		}
		d.errorAt(p, PathField("", full), "%s", e.Msg)
	}
	if errs != nil {
		return nil
	}
	kept := make(map[string]Pos)
	for k, sp := range pos {
		if strings.HasPrefix(k, field) {
			kept[k] = sp.pos
		}
	}
	return &Template{Template: t, Pos: d.pos(resolve(n)), Field: field, prefix: prefix, positions: kept}
}

// lookup walks a decoded document along p.
func lookup(v any, p expr.Path) any {
	for _, e := range p {
		switch e := e.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[e]
		case int:
			l, _ := v.([]any)
			if e >= len(l) {
				return nil
			}
			v = l[e]
		}
	}
	return v
}

// decodeInto decodes field key of the mapping f (the field prefix) with
// decode into *dst; check, when not nil, says what is wrong with the value
// decoded ("": nothing), reported at the field. The value is kept either
// way, so that one error does not hide the next.
func decodeInto[T any](d *decoder, f map[string]*yaml.Node, prefix, key string, dst *T, decode func(*yaml.Node, string) (T, bool), check func(T) string) {
	n, ok := f[key]
	if !ok {
		return
	}
	v, ok := decode(n, prefix+"."+key)
	if !ok {
		return
	}
	if check != nil {
		if msg := check(v); msg != "" {
			d.errorf(n, prefix+"."+key, "%s", msg)
		}
	}
	*dst = v
}

// decodeOneOf decodes field key of the mapping f (the field prefix), which
// must be one of values, into *dst.
func decodeOneOf[T ~string](d *decoder, f map[string]*yaml.Node, prefix, key string, dst *T, values ...T) {
	decodeInto(d, f, prefix, key, dst, func(n *yaml.Node, field string) (T, bool) {
		names := make([]string, len(values))
		for i, v := range values {
			names[i] = string(v)
		}
		v, ok := d.oneOf(n, field, names...)
		return T(v), ok
	}, nil)
}

// count decodes an integer as an int.
func (d *decoder) count(n *yaml.Node, field string) (int, bool) {
	v, ok := d.integer(n, field)
	return int(v), ok
}

// failIf is the message format says with args when bad, else "": what a
// check of decodeInto returns.
func failIf(bad bool, format string, args ...any) string {
	if !bad {
		return ""
	}
	return fmt.Sprintf(format, args...)
}
