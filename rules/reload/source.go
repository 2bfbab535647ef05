// Package reload keeps a rule set in step with the rule files while
// syncloop runs: it watches the -f paths with fsnotify (directories, so
// editors' atomic renames and the kubelet's ConfigMap "..data" swap are
// seen), debounces bursts of events, re-reads what changed and hands over a
// new rules.Set. A file with an error keeps its last good version in force.
//
// It knows nothing of the engine: it produces sets, and whoever runs them
// diffs them (rules carry content hashes).
package reload

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/syncloop/syncloop/rules"
)

// Source is the rule files under a list of paths, each remembered with its
// last good version.
type Source struct {
	loader *rules.Loader
	roots  []string
	files  map[string]*fileState
	gen    int    // load counter: when each file last changed
	errKey string // the previous load's errors, to tell when they change
	held   bool   // this load held an emptied file back (Status.Unsettled)

	tenantFiles func() []TenantFile // UseTenantFiles; nil: none
	// lastGood is the version of a broken file the rules' revisions say
	// was last in force (UseLastGood); nil: none.
	lastGood func(path string, current *rules.File) (*rules.File, error)
}

// UseLastGood makes fn what a load asks, once for each broken content of
// a file, for the file's last good version; current is the version this
// process has in force (nil: none). A syncloop restarted while a file is
// broken so runs what ran before instead of nothing, and a replica that
// loaded an older version than the others did before the file broke
// runs theirs, not its own (the manager answers from the rules'
// revisions, which every replica records). fn returns current to keep
// it, nil when it knows of none; an error (the cluster unreadable) is
// tried again at the next load. Set it before the first Load.
func (s *Source) UseLastGood(fn func(path string, current *rules.File) (*rules.File, error)) {
	s.lastGood = fn
}

// TenantFile is a rule file a team keeps in its namespace (a key of a
// ConfigMap there): its rules are the tenant rules of Namespace
// (rules.Loader.ForTenant). Path names it in errors.
type TenantFile struct {
	Path      string
	Namespace string
	Data      []byte
}

// UseTenantFiles makes files what every later load asks for the tenant
// rule files it reads besides the roots': a file no longer among them
// takes its rules with it. Set it before the first Load; files is called
// from Load's goroutine.
func (s *Source) UseTenantFiles(files func() []TenantFile) { s.tenantFiles = files }

type fileState struct {
	sum     [32]byte
	gen     int         // the load in which the content last changed
	parsed  *rules.File // the current content, when it parses
	err     error       // why the current content is not in force; nil when it is
	inForce *rules.File // the version in the set built last; nil if none
	// held is true while the file reads empty after holding rules and that
	// emptiness has not yet been seen twice: a file being written in place
	// (os.WriteFile, a shell's >) is empty between its truncation and its
	// write, and a reload that caught that instant would otherwise make
	// "no rules" the file's last good version.
	held bool
	// asked is true once the last good version of the broken content
	// was asked for (UseLastGood), found or not; fromEarlier is what was
	// put in force from the answer, and recoverErr why it could not be
	// asked (tried again).
	asked       bool
	fromEarlier *rules.File
	recoverErr  error
	// arrived is when the bytes summed arrivedSum were first read.
	arrived    time.Time
	arrivedSum [32]byte
}

// FileError is a file whose current content does not load. When LastGood
// is true its previous version stays in force; Recovered says it is the
// version an earlier process ran, recovered from the rules' revisions.
type FileError struct {
	Path      string
	Err       error
	LastGood  bool
	Recovered bool
}

func (e FileError) Error() string {
	kept := "no version of it is in force"
	switch {
	case e.Recovered:
		kept = "its last good version, recovered from the rules' revisions, is in force"
	case e.LastGood:
		kept = "its last good version stays in force"
	}
	return fmt.Sprintf("%s (%s)", e.Err, kept)
}

// Status is the outcome of a load: the set in force and the files that
// failed.
type Status struct {
	Set    *rules.Set
	Errors []FileError
	// Changed is true when a file was added, removed or changed, or the
	// errors changed, since the previous load (always true for the first).
	Changed bool
	// Unsettled is true when a file that held rules read empty and its
	// previous version was kept for this load: load again after a pause
	// (the Watcher does, after its debounce) and, still empty, the file's
	// rules go.
	Unsettled bool
	// Retry is true when a file failed for a reason outside it (a read of
	// the cluster: rules.Retryable): load again after a while (the
	// Watcher does, with backoff) and the file is parsed again.
	Retry bool
}

// NewSource returns a Source over roots (files or directories, as -f).
func NewSource(loader *rules.Loader, roots []string) *Source {
	return &Source{loader: loader, roots: roots, files: map[string]*fileState{}}
}

// Loader is the loader the files are parsed with: its compiled modules
// are released there (rules.Loader.ReleaseModules).
func (s *Source) Loader() *rules.Loader { return s.loader }

// Roots are the paths the Source reads.
func (s *Source) Roots() []string { return s.roots }

// Load reads the files again. Files whose bytes did not change are not
// parsed again. A file with errors keeps its last good version; a file that
// disappeared from an existing directory takes its rules with it; a root
// that disappeared keeps the last good version of everything under it
// (an unmounted volume is more likely an accident than an intent).
func (s *Source) Load() Status {
	s.gen++
	s.held = false
	changed := s.gen == 1
	seen := map[string]bool{}
	var rootErrs []FileError
	for _, root := range s.roots {
		files, err := rules.FindFiles(root)
		if err != nil {
			rootErrs = append(rootErrs, FileError{Path: root, Err: err, LastGood: s.hasFilesUnder(root)})
			for p := range s.files {
				if under(p, root) {
					seen[p] = true // keep them
				}
			}
			continue
		}
		for _, f := range files {
			seen[f] = true
			if s.read(f) {
				changed = true
			}
		}
	}
	if s.tenantFiles != nil {
		for _, tf := range s.tenantFiles() {
			seen[tf.Path] = true
			if s.readTenant(tf) {
				changed = true
			}
		}
	}
	for p := range s.files {
		if !seen[p] {
			delete(s.files, p)
			changed = true
		}
	}
	if s.recover() {
		changed = true
	}
	st := Status{Unsettled: s.held}
	st.Set, st.Errors = s.build()
	for _, e := range st.Errors {
		st.Retry = st.Retry || rules.IsRetryable(e.Err)
	}
	for _, fs := range s.files {
		st.Retry = st.Retry || fs.recoverErr != nil
	}
	st.Errors = append(rootErrs, st.Errors...)
	var key strings.Builder
	for _, e := range st.Errors {
		key.WriteString(e.Path + "\x00" + e.Error() + "\x00")
	}
	st.Changed = changed || key.String() != s.errKey
	s.errKey = key.String()
	return st
}

// recover asks, once for each broken content of a file (and again after
// AskAgain), for the file's last good version (UseLastGood), and puts the
// answer in force. It reports whether that changed a version in force.
func (s *Source) recover() (changed bool) {
	if s.lastGood == nil {
		return false
	}
	for path, fs := range s.files {
		if fs.asked || !fs.broken() {
			continue
		}
		f, err := s.lastGood(path, fs.inForce)
		if fs.recoverErr = err; err != nil {
			continue
		}
		fs.asked = true
		if f != nil && f != fs.inForce {
			fs.fromEarlier, fs.inForce = f, f
			changed = true
		}
	}
	return changed
}

// AskAgain makes the next Load ask again for the last good version of
// each broken file (UseLastGood): the answer may have changed — another
// replica recorded, after this one asked, the version it ran before the
// file broke. It reports whether a file is broken: whether a Load has
// anything to ask.
func (s *Source) AskAgain() bool {
	found := false
	for _, fs := range s.files {
		if fs.broken() {
			fs.asked, found = false, true
		}
	}
	return found && s.lastGood != nil
}

// broken reports whether the file's current content does not load.
func (fs *fileState) broken() bool { return fs.parsed == nil && fs.err != nil }

// Invalidate makes the next Load parse every file again, changed or not:
// the schemas the rules were checked against changed (a CRD was updated).
// A rule that no longer type-checks is then reported like a broken file
// and keeps its last good version.
func (s *Source) Invalidate() {
	for _, fs := range s.files {
		fs.sum = [32]byte{}
	}
}

// read reads one file and parses it if its bytes changed; it reports
// whether they did.
func (s *Source) read(path string) bool {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		delete(s.files, path) // gone between listing and reading
		return true
	case err != nil:
		fs := s.state(path)
		fs.parsed, fs.err, fs.gen, fs.asked = nil, err, s.gen, false
		return true
	}
	if fs := s.files[path]; fs != nil {
		switch {
		case len(data) == 0 && !fs.held && fs.inForce != nil && len(fs.inForce.Rules) > 0:
			// Emptied: perhaps truncated by a write still under way. Keep
			// the version in force for this load; the next one decides.
			fs.held, s.held = true, true
			fs.sum, fs.parsed, fs.err = sha256.Sum256(data), nil, nil
			return false
		case fs.held:
			fs.held = false
			fs.sum = [32]byte{} // parse what is there now, even if still empty
		}
	}
	// A rule file's modules are beside it: a changed one parses the file
	// again (and its rules become new revisions).
	return s.parse(path, append(data, modulesBeside(path)...), func(path string, _ []byte) (*rules.File, error) {
		return s.loader.Parse(path, data)
	})
}

// modulesBeside is what the WebAssembly modules in path's directory hold
// (name and sha256 of each, in order), for telling when one changed.
func modulesBeside(path string) []byte {
	mods, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.wasm"))
	gz, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.wasm.gz"))
	mods = append(mods, gz...)
	var out []byte
	for _, m := range mods {
		data, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		sum := sha256.Sum256(data)
		out = append(append(append(out, 0), filepath.Base(m)...), sum[:]...)
	}
	return out
}

// readTenant parses a tenant file, as a tenant rule file of its
// namespace, if its bytes changed; it reports whether they did.
func (s *Source) readTenant(tf TenantFile) bool {
	return s.parse(tf.Path, tf.Data, func(path string, data []byte) (*rules.File, error) {
		l, err := s.loader.ForTenant(tf.Namespace)
		if err != nil {
			return nil, err
		}
		return l.Parse(path, data)
	})
}

// state is what is remembered of path, made on first use.
func (s *Source) state(path string) *fileState {
	fs := s.files[path]
	if fs == nil {
		fs = &fileState{}
		s.files[path] = fs
	}
	return fs
}

// parse parses path's data with parse unless its bytes are those parsed
// already; it reports whether they changed. The version parsed is
// stamped with when these bytes were first read (File.LoadedAt): parsed
// again, unchanged (a CRD changed, a read of the cluster failed), it
// keeps its stamp.
func (s *Source) parse(path string, data []byte, parse func(string, []byte) (*rules.File, error)) bool {
	fs := s.state(path)
	sum := sha256.Sum256(data)
	if sum == fs.sum && fs.gen != 0 && !rules.IsRetryable(fs.err) {
		return false
	}
	if sum != fs.arrivedSum || fs.arrived.IsZero() {
		fs.arrived, fs.arrivedSum = time.Now(), sum
	}
	fs.sum, fs.gen, fs.asked = sum, s.gen, false
	if fs.parsed, fs.err = parse(path, data); fs.err != nil {
		fs.parsed = nil
	} else {
		fs.parsed.LoadedAt = fs.arrived
	}
	return true
}

// build assembles the set: each file's current version when it parses, its
// version in force otherwise. Files are taken oldest change first, so when
// two files name the same rule the one that changed last loses and keeps
// its previous version (or, without one, stays out) until the conflict is
// gone.
func (s *Source) build() (*rules.Set, []FileError) {
	paths := make([]string, 0, len(s.files))
	for p := range s.files {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool {
		a, b := s.files[paths[i]], s.files[paths[j]]
		if a.gen != b.gen {
			return a.gen < b.gen
		}
		return paths[i] < paths[j]
	})
	names := map[string]string{} // rule name → file
	var kinds []*rules.Rule      // the rules chosen that define a kind
	var chosen []*rules.File
	for _, p := range paths {
		fs := s.files[p]
		if fs.parsed != nil {
			fs.err = nil
		}
		for _, candidate := range []*rules.File{fs.parsed, fs.inForce} {
			if candidate == nil {
				continue
			}
			if other := clash(candidate, names); other != "" {
				fs.err = fmt.Errorf("%s: rule %q is also defined in %s", p, other, names[other])
				continue
			}
			if r, other := kindClash(candidate, kinds); r != nil {
				fs.err = fmt.Errorf("%s: rule %q defines %s, which rule %s of %s defines too: one rule serves a kind",
					p, r.Name, r.API.CRDName(), other.Name, names[other.Name])
				continue
			}
			for _, r := range candidate.Rules {
				names[r.Name] = p
				if r.API != nil {
					kinds = append(kinds, r)
				}
			}
			chosen = append(chosen, candidate)
			fs.inForce = candidate
			break
		}
		if fs.err != nil && (len(chosen) == 0 || chosen[len(chosen)-1] != fs.inForce) {
			fs.inForce = nil
		}
	}
	set, err := rules.NewSet(chosen...)
	if err != nil { // cannot happen: names were checked
		return nil, []FileError{{Err: err}}
	}
	sort.Strings(paths)
	return set, s.errors(paths)
}

// clash returns the first rule name of f already in names.
func clash(f *rules.File, names map[string]string) string {
	for _, r := range f.Rules {
		if _, ok := names[r.Name]; ok {
			return r.Name
		}
	}
	return ""
}

// kindClash returns a rule of f that defines a kind a rule of chosen
// defines, and that rule.
func kindClash(f *rules.File, chosen []*rules.Rule) (*rules.Rule, *rules.Rule) {
	for _, r := range f.Rules {
		for _, other := range chosen {
			if r.API != nil && r.API.Defines(other.API) {
				return r, other
			}
		}
	}
	return nil, nil
}

func (s *Source) errors(paths []string) []FileError {
	var out []FileError
	for _, p := range paths {
		if fs := s.files[p]; fs.err != nil {
			out = append(out, FileError{Path: p, Err: fs.err, LastGood: fs.inForce != nil, Recovered: fs.inForce != nil && fs.inForce == fs.fromEarlier})
		}
	}
	return out
}

func (s *Source) hasFilesUnder(root string) bool {
	for p, fs := range s.files {
		if under(p, root) && fs.inForce != nil {
			return true
		}
	}
	return false
}

func under(path, root string) bool {
	return path == root || strings.HasPrefix(path, filepath.Clean(root)+string(filepath.Separator))
}
