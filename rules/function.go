package rules

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/syncloop/syncloop/rules/function"
)

// Function steps: a resource whose children a WebAssembly module computes
// (rules/function runs it). The module is a file beside the rule file,
// compiled when the rule loads; its digest becomes part of the rule (its
// hash and its recorded source), so a new module is a new revision of the
// rule, rolled out as one.

// Function is a resource's function step.
type Function struct {
	// Wasm is the module's file as the rule names it; Digest the sha256
	// of its content, hex.
	Wasm, Digest string
	// Module is nil in a rule compiled for inspection whose module this
	// process has not loaded (Loader.ForInspection): calling it fails.
	Module *function.Module
	// Reads are the resources whose children the function is given, as
	// children.<id>: the resource depends on them.
	Reads  []string
	Limits function.Limits
	// Serve: the module stays up between calls, answering one request
	// per line (function.Module.Serve).
	Serve bool
	// Pos and Field are where the rule writes it.
	Pos   Pos
	Field string
}

// MaxFunctionTimeout is the longest a rule may let one call run.
const MaxFunctionTimeout = time.Minute

// maxModuleSize bounds a module file: what one reconcile may load.
const maxModuleSize = 64 << 20

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// decodeFunction decodes a resource's function (n, at field) and loads
// its module; the module's digest is written into the rule's document
// (docVal), so that the rule's hash and source name it.
func (d *decoder) decodeFunction(res *Resource, n *yaml.Node, field string, docVal any) {
	f := d.fields(n, field, RuleFormat.known("spec.resources.function")...)
	if f == nil {
		return
	}
	fn := &Function{Pos: d.pos(resolve(n)), Field: field, Limits: function.DefaultLimits}
	if tn, ok := f["timeout"]; ok {
		if v, ok := d.duration(tn, field+".timeout"); ok {
			if v == 0 || v > MaxFunctionTimeout {
				d.errorf(tn, field+".timeout", "must be more than 0 and at most %s", MaxFunctionTimeout)
			}
			fn.Limits.Timeout = v
		}
	}
	if sn, ok := f["serve"]; ok {
		fn.Serve, _ = d.boolean(sn, field+".serve")
	}
	ids := declaredIDs(docVal, "resources")
	if rn, ok := f["reads"]; ok {
		for j, en := range d.seq(rn, field+".reads") {
			ef := fmt.Sprintf("%s.reads[%d]", field, j)
			id, ok := d.str(en, ef)
			switch {
			case !ok:
			case id == res.ID:
				d.errorf(en, ef, "a resource cannot read its own children")
			case !slices.Contains(ids, id):
				d.errorf(en, ef, "no resource %q in spec.resources", id)
			case slices.Contains(fn.Reads, id):
				d.errorf(en, ef, "%q is listed twice", id)
			default:
				fn.Reads = append(fn.Reads, id)
				res.Refs = append(res.Refs, Ref{ID: id, Pos: d.pos(resolve(en))})
			}
		}
	}
	if sn, ok := f["sha256"]; ok {
		if v, ok := d.str(sn, field+".sha256"); ok && !sha256Hex.MatchString(v) {
			d.errorf(sn, field+".sha256", "must be the module's sha256 in 64 lowercase hex digits")
		} else {
			fn.Digest = v
		}
	}
	wn, ok := f["wasm"]
	if !ok {
		d.errorf(n, field+".wasm", "required: the module's file (a WASI command, .wasm), beside the rule file")
		return
	}
	if fn.Wasm, ok = d.str(wn, field+".wasm"); !ok {
		return
	}
	m, digest, err := d.functions.load(d.file, fn.Wasm, fn.Digest, d.fromRevision, d.tenant != "")
	if err != nil && d.fromRevision && d.absentModules && fn.Digest != "" {
		m, digest, err = nil, fn.Digest, nil // Module nil: it cannot run here
	}
	if err != nil {
		d.errorf(wn, field+".wasm", "%v", err)
		return
	}
	fn.Module, fn.Digest = m, digest
	if doc, ok := lookup(docVal, []any{"spec", "resources", res.Index, "function"}).(map[string]any); ok {
		doc["sha256"] = digest
	}
	res.Function = fn
}

// functionStore compiles the modules rules call, once each, and keeps
// them by digest, so that a rule's earlier revision (a rollout's previous
// one) finds the module it was recorded with while this process has it.
// Loaders copied from one another share it.
type functionStore struct {
	mu       sync.Mutex
	memory   int64
	rt       *function.Runtime // made at the first module
	byDigest map[string]*function.Module
}

func newFunctionStore() *functionStore {
	return &functionStore{memory: function.DefaultMemory, byDigest: map[string]*function.Module{}}
}

// load returns the module file (in the rule file's directory) names,
// compiled, and its digest, which must be want if that is set. A
// rule from a revision, or a tenant's (whose file is a ConfigMap's key),
// has no directory: its module is found by digest among those loaded.
func (s *functionStore) load(ruleFile, file, want string, fromRevision, tenant bool) (*function.Module, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fromRevision || tenant {
		if m, ok := s.byDigest[want]; ok && want != "" {
			return m, want, nil
		}
		if tenant {
			return nil, "", fmt.Errorf("a tenant rule cannot load a module from a file: functions are for the rules syncloop is given")
		}
		return nil, "", fmt.Errorf("module %s (sha256 %.12s) is not loaded in this process: the revision cannot run without it", file, want)
	}
	if file != filepath.Base(file) || file == "." || file == ".." || file == "" {
		return nil, "", fmt.Errorf("%q: name a file beside the rule file (no directories): syncloop watches it there, and a ConfigMap holds both", file)
	}
	path := filepath.Join(filepath.Dir(ruleFile), file)
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil, "", fmt.Errorf("reading the module: %w", err)
	case !fi.Mode().IsRegular():
		return nil, "", fmt.Errorf("%s is not a file", path)
	case fi.Size() > maxModuleSize:
		return nil, "", fmt.Errorf("%s is %d bytes, more than the %d a module may have", path, fi.Size(), maxModuleSize)
	}
	wasm, err := readModule(path)
	if err != nil {
		return nil, "", err
	}
	if s.rt == nil {
		if s.rt, err = function.NewRuntime(context.Background(), s.memory); err != nil {
			return nil, "", err
		}
	}
	m, err := s.rt.Compile(context.Background(), wasm)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	digest := hex.EncodeToString(m.Digest[:])
	if want != "" && want != digest {
		return nil, "", fmt.Errorf("%s has sha256 %s, not the %s the rule names", path, digest, want)
	}
	s.byDigest[digest] = m
	return m, digest, nil
}

// readModule reads the module at path; a .wasm.gz file is gunzipped (a
// module that fits a ConfigMap, whose limit is 1 MiB, better so).
func readModule(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the module: %w", err)
	}
	if !strings.HasSuffix(path, ".gz") {
		return data, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	wasm, err := io.ReadAll(io.LimitReader(zr, maxModuleSize+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, err)
	case len(wasm) > maxModuleSize:
		return nil, fmt.Errorf("%s holds more than the %d bytes a module may have", path, maxModuleSize)
	}
	return wasm, nil
}

// Body is where the resource says what its children are: its template's
// position and field, or its function's.
func (res *Resource) Body() (Pos, string) {
	if res.Function != nil {
		return res.Function.Pos, res.Function.Field
	}
	return res.Template.Pos, res.Template.Field
}

// SetFunctionMemory sets the most linear memory a function's module may
// have (function.DefaultMemory unless set). Call it before the first rule
// with a function loads: the modules share one runtime.
func (l *Loader) SetFunctionMemory(bytes int64) {
	l.functions.mu.Lock()
	defer l.functions.mu.Unlock()
	l.functions.memory = bytes
}

// ForInspection is ForRevisions for a process that reads what syncloop
// recorded without running it (trace): a revision whose module it has not
// loaded still compiles — its rule can be matched and shown — and its
// function fails when called, saying so.
func (l *Loader) ForInspection() *Loader {
	c := l.ForRevisions()
	c.absentModules = true
	return c
}
