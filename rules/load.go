package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/internal/panics"
	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// File is one parsed rule file: its rules, or the errors that keep it out.
type File struct {
	Path  string
	Rules []*Rule
	// LoadedAt is when this process first read the content: replicas
	// order the versions of a file they loaded by it. Zero: not known.
	LoadedAt time.Time
	// Skipped counts documents that are not rules (sample objects, CRDs).
	Skipped int
	// Warnings are what the rules may get wrong without being invalid:
	// required fields a template lacks (defaulting or admission may set
	// them). Each Msg starts with "warning: ".
	Warnings ErrorList
	// Notes name the kinds the rules touch that have no schema: what
	// expressions read of them is dyn, their templates are not checked.
	// Each Msg starts with "note: "; the CLI shows them at -v=2.
	Notes ErrorList
}

// Set is a loaded rule set: every rule of every file, names unique. It is
// immutable.
type Set struct {
	files  []*File
	rules  []*Rule // sorted by name
	byName map[string]*Rule
}

// Rules returns the rules sorted by name. The caller must not modify the
// slice.
func (s *Set) Rules() []*Rule { return s.rules }

// Get returns the named rule, or nil.
func (s *Set) Get(name string) *Rule { return s.byName[name] }

// Len is the number of rules.
func (s *Set) Len() int { return len(s.rules) }

// Files returns the files the set was built from, in the order given.
func (s *Set) Files() []*File { return s.files }

// Loader parses rule files with one CEL compiler, checking templates
// against the schemas it knows: the built-in kinds', and those of the
// CustomResourceDefinitions given to UseCRDs or found among the files.
type Loader struct {
	compiler *expr.Compiler
	settings
	// panicked is told of a panic a parse contained (ReportPanics).
	panicked func(path string, err *panics.Error)
}

// ReportPanics makes fn what later parses tell of a panic they contained:
// the file fails to load (its last good version stays in force), and fn
// may log the stack and count it. A panic is told once per parse, so once
// per change of the file.
func (l *Loader) ReportPanics(fn func(path string, err *panics.Error)) { l.panicked = fn }

// NewLoader returns a Loader whose expressions evaluate under opts.
func NewLoader(opts expr.Options) (*Loader, error) {
	c, err := expr.NewCompiler(opts)
	if err != nil {
		return nil, err
	}
	return &Loader{compiler: c, settings: settings{schemas: kinds.Builtin(), scopes: builtinScopes{},
		identities: identities{home: DefaultServiceAccountNamespace}, functions: newFunctionStore()}}, nil
}

// ForRevisions is a copy of l that compiles the recorded revisions of
// rules (a rollout's previous one): the served CRDs of the kinds rules
// define are not checked — they are the newer revision's.
func (l *Loader) ForRevisions() *Loader {
	c := *l
	c.crds, c.fromRevision = nil, true
	return &c
}

// UseSchemas makes s the source of the schemas later loads check against
// (CRDs among the files still come first): `run` gives the API server's
// (kinds.Served), so that installed custom kinds are known.
func (l *Loader) UseSchemas(s kinds.Source) { l.schemas = s }

// SetInstallation makes the rules of later loads act for the installation
// of syncloop named name: their children carry it (LabelInstallation) and
// their field managers name it, so that two installations in one cluster
// never take each other's children. "" is the default installation, whose
// children carry no name — those of syncloop versions before names.
func (l *Loader) SetInstallation(name string) error {
	if err := ValidateInstallation(name); err != nil {
		return err
	}
	l.installation = name
	return nil
}

// ValidateInstallation checks an installation name: empty (the default
// installation) or a DNS-1123 label, as a label value must be.
func ValidateInstallation(name string) error {
	if errs := validation.IsDNS1123Label(name); name != "" && len(errs) > 0 {
		return fmt.Errorf("installation %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// UseScopes makes s what later loads learn the scope of kinds from (CRDs
// among the files still come first): `run` and `plan` give the cluster's
// discovery, so that installed custom kinds are known.
func (l *Loader) UseScopes(s ScopeSource) { l.scopes = s }

// UseCRDs makes the kinds that the CustomResourceDefinitions among objs
// define known to the checks of later loads (objects of other kinds are
// ignored), as `render --objects` and `validate` use them.
func (l *Loader) UseCRDs(objs []*unstructured.Unstructured) {
	l.schemas, l.scopes = withCRDs(objs, l.schemas, l.scopes)
}

// withCRDs puts the schemas and scopes of the CustomResourceDefinitions
// among objs before schemas and scopes.
func withCRDs(objs []*unstructured.Unstructured, schemas kinds.Source, scopes ScopeSource) (kinds.Source, ScopeSource) {
	var crds []map[string]any
	for _, o := range objs {
		if kinds.IsCRD(o.Object) {
			crds = append(crds, o.Object)
		}
	}
	if len(crds) == 0 {
		return schemas, scopes
	}
	return kinds.FromCRDs(crds, schemas), scopeTable{kinds: crdScopes(objs), next: scopes}
}

// Load finds the rule files under paths (see FindFiles), parses them all and
// builds a Set. The error, if any, is an ErrorList naming every problem in
// every file; no Set is returned then.
func (l *Loader) Load(paths ...string) (*Set, error) {
	files, err := FindFiles(paths...)
	if err != nil {
		return nil, err
	}
	// A rule may template a kind whose CRD is in another of the files.
	var crds []*unstructured.Unstructured
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil {
			crds = append(crds, kindsIn(f, data)...)
		}
	}
	l.UseCRDs(crds)
	var parsed []*File
	var errs ErrorList
	for _, f := range files {
		pf, err := l.ParseFile(f)
		if err != nil {
			errs = append(errs, asErrorList(err)...)
			continue
		}
		parsed = append(parsed, pf)
	}
	if len(errs) > 0 {
		return nil, errs.errOrNil()
	}
	return NewSet(parsed...)
}

func asErrorList(err error) ErrorList {
	var el ErrorList
	if errors.As(err, &el) {
		return el
	}
	var e *Error
	if errors.As(err, &e) {
		return ErrorList{e}
	}
	return ErrorList{{Msg: err.Error()}}
}

// ParseFile reads and parses one rule file. Any error in any of its rules
// fails the whole file (an ErrorList): a file is in force entirely or not at
// all.
func (l *Loader) ParseFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, ErrorList{{Pos: Pos{File: path}, Msg: err.Error()}}
	}
	return l.Parse(path, data)
}

// maxFileSize bounds one rule file; a ConfigMap holds at most 1 MiB anyway.
const maxFileSize = 4 << 20

// Parse parses rule documents from data, named path in errors. A panic
// in it — what a rule file holds, however hostile, must never stop
// syncloop — is the file's error (wrapping a *panics.Error).
func (l *Loader) Parse(path string, data []byte) (_ *File, err error) {
	defer func() {
		if v := recover(); v != nil {
			pe := panics.New(v)
			if l.panicked != nil {
				l.panicked(path, pe)
			}
			err = ErrorList{{Pos: Pos{File: path}, Msg: pe.Error(), Err: pe}}
		}
	}()
	if len(data) > maxFileSize {
		return nil, ErrorList{{Pos: Pos{File: path}, Msg: fmt.Sprintf("file too large: %d bytes, the limit is %d", len(data), maxFileSize)}}
	}
	f := &File{Path: path}
	lines := strings.Split(string(data), "\n")
	schemas, scopes := withCRDs(kindsIn(path, data), l.schemas, l.scopes)
	var errs ErrorList
	names := map[string]Pos{}
	if err := eachDocument(path, data, func(root *yaml.Node) {
		if !isRuleDocument(root) {
			f.Skipped++
			return
		}
		d := &decoder{file: path, lines: lines, settings: l.settings}
		d.schemas, d.scopes = schemas, scopes
		r := d.decodeRule(root, l.compiler)
		errs = append(errs, d.errs...)
		f.Warnings = append(f.Warnings, d.warns...)
		f.Notes = append(f.Notes, d.notes...)
		if r == nil {
			return
		}
		if prev, dup := names[r.Name]; dup {
			errs = append(errs, &Error{Pos: r.Pos, Rule: r.Name, Field: "metadata.name",
				Msg: fmt.Sprintf("rule name used twice: also at %s", prev)})
			return
		}
		names[r.Name] = r.Pos
		f.Rules = append(f.Rules, r)
	}); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errs.errOrNil()
	}
	return f, nil
}

// eachDocument calls fn with the root of each non-empty YAML document in
// data; a syntax error ends the walk (the parser cannot resume after one)
// and is returned.
func eachDocument(path string, data []byte, fn func(root *yaml.Node)) *Error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return syntaxError(path, err)
		}
		if len(doc.Content) == 0 || isNull(doc.Content[0]) {
			continue // an empty document, e.g. after a trailing ---
		}
		fn(doc.Content[0])
	}
}

// kindsIn returns the CustomResourceDefinitions among the documents of a
// rule file and those of the kinds its rules define (spec.api), so that
// every rule is typed by them, the rule that defines a kind too. The
// latter's status keeps any value here: it is typed from the rule's
// status template, which is typed by the kind. A panic in it gives no
// kinds: Parse, which calls it too, reports the panic as the file's.
func kindsIn(path string, data []byte) (crds []*unstructured.Unstructured) {
	defer func() {
		if recover() != nil {
			crds = nil
		}
	}()
	crds = crdsIn(data)
	if !bytes.Contains(data, []byte("api:")) { // not "apiVersion:"
		return crds
	}
	lines := strings.Split(string(data), "\n")
	_ = eachDocument(path, data, func(root *yaml.Node) {
		if !isRuleDocument(root) {
			return
		}
		n := apiNode(root)
		if n == nil {
			return
		}
		d := &decoder{file: path, lines: lines}
		a := d.decodeAPI(n)
		if a == nil {
			return // the rule's decoding reports why
		}
		a.Status = expr.AnySchema()
		a.Status.Type = spec.StringOrArray{"object"}
		crds = append(crds, (&Rule{Name: peekName(root), API: a}).CRD())
	})
	return crds
}

// apiNode is a rule document's spec.api, or nil.
func apiNode(root *yaml.Node) *yaml.Node {
	_, spec := entry(root, "spec")
	_, api := entry(spec, "api")
	return api
}

// crdsIn returns the CustomResourceDefinitions among the documents of a
// rule file; documents that do not decode are the parse's to report.
func crdsIn(data []byte) []*unstructured.Unstructured {
	if !bytes.Contains(data, []byte("CustomResourceDefinition")) {
		return nil
	}
	var out []*unstructured.Unstructured
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil {
			return out
		}
		if doc != nil && kinds.IsCRD(doc) {
			if v, ok := jsonCompatible(doc).(map[string]any); ok {
				out = append(out, &unstructured.Unstructured{Object: v})
			}
		}
	}
}

// jsonCompatible turns YAML-decoded values (int, map[string]any) into the
// JSON-compatible ones unstructured objects hold.
func jsonCompatible(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonCompatible(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = jsonCompatible(e)
		}
		return v
	case int:
		return int64(v)
	}
	return v
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError turns a YAML parser error into an Error at its line (the
// parser does not report a column).
func syntaxError(path string, err error) *Error {
	msg := err.Error()
	p := Pos{File: path}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	return &Error{Pos: p, Msg: "YAML: " + msg}
}

// NewSet combines parsed files into a Set; rule names must be unique across
// them (the error names both places).
func NewSet(files ...*File) (*Set, error) {
	s := &Set{files: files, byName: map[string]*Rule{}}
	var errs ErrorList
	for _, f := range files {
		for _, r := range f.Rules {
			if prev, dup := s.byName[r.Name]; dup {
				errs = append(errs, &Error{Pos: r.Pos, Rule: r.Name, Field: "metadata.name",
					Msg: fmt.Sprintf("rule name used twice: also at %s", prev.Pos)})
				continue
			}
			s.byName[r.Name] = r
			s.rules = append(s.rules, r)
		}
	}
	errs = append(errs, s.checkAPIs()...)
	if len(errs) > 0 {
		return nil, errs.errOrNil()
	}
	sort.Slice(s.rules, func(i, j int) bool { return s.rules[i].Name < s.rules[j].Name })
	return s, nil
}

// checkAPIs finds two rules that define one kind (or one resource): only
// one may serve it. Rules in file order; the later one is the error.
func (s *Set) checkAPIs() ErrorList {
	var errs ErrorList
	var defined []*Rule
	for _, r := range s.rules {
		if r.API == nil {
			continue
		}
		for _, prev := range defined {
			if prev.API.Defines(r.API) {
				errs = append(errs, &Error{Pos: r.API.Pos, Rule: r.Name, Field: "spec.api",
					Msg: fmt.Sprintf("%s %s (%s) is defined by rule %s too, at %s: one rule serves a kind", r.API.APIVersion, r.API.Kind, r.API.CRDName(), prev.Name, prev.API.Pos)})
			}
		}
		defined = append(defined, r)
	}
	return errs
}

// Only is the set of the rules of s that keep says to keep.
func (s *Set) Only(keep func(*Rule) bool) *Set {
	out := &Set{files: s.files, byName: map[string]*Rule{}}
	for _, r := range s.rules {
		if keep(r) {
			out.rules = append(out.rules, r)
			out.byName[r.Name] = r
		}
	}
	return out
}

// Default returns objs with the defaults of the kinds the set's rules
// define applied, as the API server applies them to every object it
// serves; objects of other kinds are returned as they are, and objs is
// not modified.
func (s *Set) Default(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	apis := map[schema.GroupVersionKind]*API{}
	for _, r := range s.rules {
		if r.API != nil {
			apis[r.API.GVK] = r.API
		}
	}
	if len(apis) == 0 {
		return objs
	}
	out := make([]*unstructured.Unstructured, len(objs))
	for i, o := range objs {
		out[i] = o
		if a, ok := apis[o.GroupVersionKind()]; ok {
			out[i] = o.DeepCopy()
			a.Default(out[i].Object)
		}
	}
	return out
}

// FindFiles expands paths into rule files. A file named directly is read
// whatever its name. A directory is walked: *.yaml and *.yml files, in
// subdirectories too; names starting with "." are skipped — which is what
// makes a ConfigMap volume work: its "..data" directory and "..2026_…"
// versions are skipped, and the visible files, symlinks into "..data", are
// followed. Symlinked directories are followed once.
func FindFiles(paths ...string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
			continue
		}
		found, err := walk(p, map[string]bool{})
		if err != nil {
			return nil, err
		}
		for _, f := range found {
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// walk lists rule files under dir; visited holds real directory paths, so
// symlink cycles end.
func walk(dir string, visited map[string]bool) ([]string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	if visited[real] {
		return nil, nil
	}
	visited[real] = true
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p) // follows symlinks
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // a dangling symlink, e.g. mid ConfigMap update
			}
			return nil, err
		}
		if fi.IsDir() {
			sub, err := walk(p, visited)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
			continue
		}
		if ext := filepath.Ext(name); ext == ".yaml" || ext == ".yml" {
			out = append(out, p)
		}
	}
	return out, nil
}
