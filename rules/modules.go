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
	"strings"
	"sync"

	"github.com/syncloop/syncloop/rules/function"
)

// The modules rules call: read from beside the rule file, compiled once,
// kept by digest while a rule in force calls them.

// functionStore compiles the modules rules call, once each, and keeps
// them by digest, so that a rule's earlier revision (a rollout's previous
// one) finds the module it was recorded with while this process has it.
// Loaders copied from one another share it.
type functionStore struct {
	mu       sync.Mutex
	memory   int64
	rt       *function.Runtime // made at the first module
	byDigest map[string]*storedModule
}

// storedModule is a compiled module the store keeps.
type storedModule struct {
	m *function.Module
	// unnamed: the last release found no rule in force calling it, and
	// no load has returned it since.
	unnamed bool
}

func newFunctionStore() *functionStore {
	return &functionStore{memory: function.DefaultMemory, byDigest: map[string]*storedModule{}}
}

// ReleaseModules closes and forgets the compiled modules that no rule of
// inForce calls — the functions of its resources, the rule's own and its
// hooks — once two releases in a row have found them so and no load has
// returned them in between: a module that a load compiled for a set not
// yet in force is kept. It returns how many it closed. A rule that still
// holds a closed module fails when it calls it; a load of its file
// compiles it again. Call it from time to time with every rule in force:
// the rule set's, and those the engine still runs (a rollout's previous
// revision).
func (l *Loader) ReleaseModules(ctx context.Context, inForce []*Rule) int {
	named := map[*function.Module]bool{}
	for _, r := range inForce {
		for _, m := range r.modules() {
			named[m] = true
		}
	}
	s := l.functions
	s.mu.Lock()
	defer s.mu.Unlock()
	closed := 0
	for digest, sm := range s.byDigest {
		switch {
		case named[sm.m]:
			sm.unnamed = false
		case !sm.unnamed:
			sm.unnamed = true
		default:
			delete(s.byDigest, digest)
			_ = sm.m.Close(ctx)
			closed++
		}
	}
	return closed
}

// modules are the compiled modules r's functions call.
func (r *Rule) modules() []*function.Module {
	var out []*function.Module
	for _, res := range r.Resources {
		fn := res.Function
		if fn == nil {
			continue
		}
		for _, f := range []*Function{fn, fn.Finalize, fn.Customize} {
			if f != nil && f.Module != nil {
				out = append(out, f.Module)
			}
		}
	}
	return out
}

// load returns the module file (in the rule file's directory) names,
// compiled, and its digest, which must be want if that is set. A rule
// from a revision has no directory: its module is found by digest among
// those loaded.
func (s *functionStore) load(ruleFile, file, want string, fromRevision bool) (*function.Module, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fromRevision {
		if sm, ok := s.byDigest[want]; ok && want != "" {
			sm.unnamed = false
			return sm.m, want, nil
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
	s.byDigest[digest] = &storedModule{m: m}
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
