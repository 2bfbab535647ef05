package reload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// doc is a valid rule named name; workers distinguishes versions.
func doc(name string, workers int) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}}
  workers: %d
`, name, workers)
}

const broken = "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  wen: x\n"

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newSource(t *testing.T, roots ...string) *Source {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return NewSource(l, roots)
}

// workers returns rule name → workers of the set, "" when set is nil.
func workers(set *rules.Set) string {
	if set == nil {
		return ""
	}
	var parts []string
	for _, r := range set.Rules() {
		parts = append(parts, fmt.Sprintf("%s=%d", r.Name, r.Workers))
	}
	return strings.Join(parts, ",")
}

func TestSourceKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "r.yaml")
	write(t, f, doc("r", 1))
	src := newSource(t, dir)
	st := src.Load()
	if workers(st.Set) != "r=1" || len(st.Errors) != 0 || !st.Changed {
		t.Fatalf("first load: %s, errors %v, changed %v", workers(st.Set), st.Errors, st.Changed)
	}
	first := st.Set.Get("r")
	if st := src.Load(); st.Changed || st.Set.Get("r") != first {
		t.Error("a load without changes reported a change or parsed the file again")
	}

	write(t, f, broken)
	st = src.Load()
	if workers(st.Set) != "r=1" {
		t.Errorf("broken file: set %s, want its last good version r=1", workers(st.Set))
	}
	if len(st.Errors) != 1 || st.Errors[0].Path != f || !st.Errors[0].LastGood || !strings.Contains(st.Errors[0].Error(), `unknown field "wen"`) {
		t.Errorf("broken file: errors %v", st.Errors)
	}
	write(t, f, doc("r", 2))
	if st := src.Load(); workers(st.Set) != "r=2" || len(st.Errors) != 0 {
		t.Errorf("fixed file: %s, errors %v", workers(st.Set), st.Errors)
	}

	// A new file that is broken from the start: nothing of it is in force.
	g := filepath.Join(dir, "new.yaml")
	write(t, g, broken)
	st = src.Load()
	if workers(st.Set) != "r=2" || len(st.Errors) != 1 || st.Errors[0].LastGood {
		t.Errorf("new broken file: %s, errors %v", workers(st.Set), st.Errors)
	}

	// A deleted file takes its rules with it.
	os.Remove(g)
	os.Remove(f)
	if st := src.Load(); workers(st.Set) != "" || len(st.Errors) != 0 {
		t.Errorf("deleted files: %s, errors %v", workers(st.Set), st.Errors)
	}
}

// TestSourceEmptiedMidWrite: a file read in the instant an in-place write
// had truncated it is empty. That emptiness is held back one load, so a
// write that then fails validation keeps the rules the file held before it,
// not "no rules"; a file emptied on purpose loses its rules on the next
// load.
func TestSourceEmptiedMidWrite(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "r.yaml")
	write(t, f, doc("r", 1))
	write(t, filepath.Join(dir, "other.yaml"), doc("other", 1))
	src := newSource(t, dir)
	src.Load()

	write(t, f, "") // truncated, the write not yet done
	st := src.Load()
	if workers(st.Set) != "other=1,r=1" || len(st.Errors) != 0 || st.Changed || !st.Unsettled {
		t.Fatalf("emptied: %s, errors %v, changed %v, unsettled %v; want r=1 kept, unsettled", workers(st.Set), st.Errors, st.Changed, st.Unsettled)
	}
	write(t, f, broken) // the write lands, and it does not validate
	st = src.Load()
	if workers(st.Set) != "other=1,r=1" || len(st.Errors) != 1 || !st.Errors[0].LastGood || st.Unsettled {
		t.Fatalf("broken after the empty read: %s, errors %v, unsettled %v; want r=1 as the last good version", workers(st.Set), st.Errors, st.Unsettled)
	}
	write(t, f, doc("r", 2))
	if st := src.Load(); workers(st.Set) != "other=1,r=2" || len(st.Errors) != 0 {
		t.Fatalf("fixed: %s, errors %v", workers(st.Set), st.Errors)
	}

	// Emptied and still empty a load later: the file's rules go, the
	// other file's stay.
	write(t, f, "")
	if st := src.Load(); !st.Unsettled || workers(st.Set) != "other=1,r=2" {
		t.Fatalf("emptied again: %s, unsettled %v", workers(st.Set), st.Unsettled)
	}
	st = src.Load()
	if workers(st.Set) != "other=1" || !st.Changed || st.Unsettled || len(st.Errors) != 0 {
		t.Fatalf("still empty: %s, changed %v, unsettled %v, errors %v; want r gone", workers(st.Set), st.Changed, st.Unsettled, st.Errors)
	}
	if st := src.Load(); st.Changed || st.Unsettled {
		t.Errorf("empty and unchanged: changed %v, unsettled %v", st.Changed, st.Unsettled)
	}
	// An empty file never held back again once it holds no rules, and a
	// new file that starts empty is simply empty.
	write(t, filepath.Join(dir, "new.yaml"), "")
	if st := src.Load(); st.Unsettled || workers(st.Set) != "other=1" {
		t.Errorf("new empty file: %s, unsettled %v", workers(st.Set), st.Unsettled)
	}
}

func TestSourceDuplicateAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	b := filepath.Join(dir, "b.yaml")
	a := filepath.Join(dir, "a.yaml")
	write(t, b, doc("x", 1))
	src := newSource(t, dir)
	src.Load()
	// a.yaml sorts first but is the newcomer: it loses.
	write(t, a, doc("x", 5)+"---\n"+doc("y", 1))
	st := src.Load()
	if workers(st.Set) != "x=1" || len(st.Errors) != 1 || st.Errors[0].Path != a || !strings.Contains(st.Errors[0].Error(), `rule "x" is also defined in `+b) {
		t.Fatalf("newcomer with a taken name: %s, errors %v", workers(st.Set), st.Errors)
	}
	// The older file lets go of the name: the newcomer now loads, untouched.
	write(t, b, doc("z", 1))
	if st := src.Load(); workers(st.Set) != "x=5,y=1,z=1" || len(st.Errors) != 0 {
		t.Errorf("after the clash is gone: %s, errors %v", workers(st.Set), st.Errors)
	}
}

// kindDoc is a valid rule named name that defines the App kind.
func kindDoc(name string) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  api:
    apiVersion: example.com/v1
    kind: App
    spec: {image: string}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}
`, name)
}

// TestSourceKindAcrossFiles: a newcomer that defines a kind another
// file's rule defines loses, as one with a taken name does, and loads once
// the other lets go.
func TestSourceKindAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	write(t, b, kindDoc("first"))
	src := newSource(t, dir)
	src.Load()
	write(t, a, kindDoc("second"))
	st := src.Load()
	if workers(st.Set) != "first=64" || len(st.Errors) != 1 || st.Errors[0].Path != a ||
		!strings.Contains(st.Errors[0].Error(), `rule "second" defines apps.example.com, which rule first of `+b+` defines too`) {
		t.Fatalf("a newcomer defining a taken kind: %s, errors %v", workers(st.Set), st.Errors)
	}
	write(t, b, doc("first", 1))
	if st := src.Load(); workers(st.Set) != "first=1,second=64" || len(st.Errors) != 0 {
		t.Errorf("after the clash is gone: %s, errors %v", workers(st.Set), st.Errors)
	}
}

func TestSourceMissingRootKeepsRules(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rules")
	write(t, filepath.Join(dir, "r.yaml"), doc("r", 1))
	src := newSource(t, dir)
	src.Load()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	st := src.Load()
	if workers(st.Set) != "r=1" || len(st.Errors) != 1 || st.Errors[0].Path != dir || !st.Errors[0].LastGood {
		t.Errorf("root gone: %s, errors %v; want r kept and the root reported", workers(st.Set), st.Errors)
	}
	write(t, filepath.Join(dir, "r.yaml"), doc("r", 3))
	if st := src.Load(); workers(st.Set) != "r=3" || len(st.Errors) != 0 {
		t.Errorf("root back: %s, errors %v", workers(st.Set), st.Errors)
	}
}

// watch runs a Watcher over roots; statuses arrive on the channel.
func watch(t *testing.T, debounce time.Duration, roots ...string) (*Source, <-chan Status) {
	t.Helper()
	src := newSource(t, roots...)
	src.Load()
	ch := make(chan Status, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w := NewWatcher(src, debounce)
	go func() {
		defer close(done)
		if err := w.Run(ctx, func(st Status) { ch <- st }); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	<-w.Ready()
	return src, ch
}

func next(t *testing.T, ch <-chan Status, want string) Status {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case st := <-ch:
			if workers(st.Set) == want {
				return st
			}
		case <-deadline:
			t.Fatalf("no reload produced %q", want)
		}
	}
}

// TestKubeletConfigMapSwap replays how the kubelet updates a ConfigMap
// volume: the new files go to a new timestamped directory, a "..data_tmp"
// symlink points at it and is renamed over "..data"; the visible files are
// symlinks into "..data" and never change.
func TestKubeletConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "..2026_11_29_10_00_00.000000001")
	write(t, filepath.Join(v1, "rules.yaml"), doc("r", 1))
	must(t, os.Symlink(filepath.Base(v1), filepath.Join(dir, "..data")))
	must(t, os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(dir, "rules.yaml")))
	_, ch := watch(t, 50*time.Millisecond, dir)

	v2 := filepath.Join(dir, "..2026_11_29_10_01_00.000000002")
	write(t, filepath.Join(v2, "rules.yaml"), doc("r", 2))
	must(t, os.Symlink(filepath.Base(v2), filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(t, os.RemoveAll(v1))
	next(t, ch, "r=2")
}

func TestEditorAtomicRename(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rules.yaml"), doc("r", 1))
	_, ch := watch(t, 50*time.Millisecond, dir)
	tmp := filepath.Join(dir, ".rules.yaml.swp")
	write(t, tmp, doc("r", 2))
	must(t, os.Rename(tmp, filepath.Join(dir, "rules.yaml")))
	next(t, ch, "r=2")
}

func TestFileDeletedAndRecreated(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, doc("r", 1))
	_, ch := watch(t, 50*time.Millisecond, dir)
	must(t, os.Remove(f))
	next(t, ch, "")
	write(t, f, doc("r", 4))
	next(t, ch, "r=4")
}

// TestFileEmptiedOnPurpose: the Watcher looks again after an emptied
// file's pause by itself — no further event is needed for its rules to go.
func TestFileEmptiedOnPurpose(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, doc("r", 1))
	_, ch := watch(t, 50*time.Millisecond, dir)
	write(t, f, "")
	next(t, ch, "")
}

func TestSingleFileRoot(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, doc("r", 1))
	write(t, filepath.Join(dir, "other.yaml"), doc("other", 1))
	_, ch := watch(t, 50*time.Millisecond, f) // -f names the file
	write(t, filepath.Join(dir, "other.yaml"), doc("other", 2))
	write(t, f, doc("r", 6))
	st := next(t, ch, "r=6")
	if st.Set.Get("other") != nil {
		t.Error("a sibling of a -f file was loaded")
	}
}

func TestDirectoryRemovedAndRecreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rules")
	write(t, filepath.Join(dir, "sub", "rules.yaml"), doc("r", 1))
	_, ch := watch(t, 50*time.Millisecond, dir)
	must(t, os.RemoveAll(dir))
	st := next(t, ch, "r=1")
	if len(st.Errors) != 1 {
		t.Errorf("root removed: %s, errors %v; want the last good rules kept and the root reported", workers(st.Set), st.Errors)
	}
	write(t, filepath.Join(dir, "sub", "rules.yaml"), doc("r", 7))
	next(t, ch, "r=7")
	// The re-created subdirectory is watched too.
	write(t, filepath.Join(dir, "sub", "rules.yaml"), doc("r", 8))
	next(t, ch, "r=8")
}

// TestBurstIsOneReload: many writes within the debounce window make one
// reload.
func TestBurstIsOneReload(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, doc("r", 1))
	const debounce = 400 * time.Millisecond
	_, ch := watch(t, debounce, dir)
	for i := 2; i <= 40; i++ {
		write(t, f, doc("r", i))
	}
	var st Status
	select {
	case st = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no reload after the burst")
	}
	if workers(st.Set) != "r=40" {
		t.Errorf("the reload after the burst loaded %s, want r=40", workers(st.Set))
	}
	select {
	case extra := <-ch:
		t.Errorf("a second reload (%s) after one burst", workers(extra.Set))
	case <-time.After(3 * debounce):
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// servedWidget is the OpenAPI v3 document an API server serves for
// test.syncloop.dev/v1 with Widget's spec having the given integer field.
func servedWidget(field string) []byte {
	return []byte(fmt.Sprintf(`{"components": {"schemas": {
  "dev.syncloop.test.v1.Widget": {
    "type": "object",
    "x-kubernetes-group-version-kind": [{"group": "test.syncloop.dev", "version": "v1", "kind": "Widget"}],
    "properties": {
      "apiVersion": {"type": "string"}, "kind": {"type": "string"},
      "metadata": {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
      "spec": {"type": "object", "properties": {%q: {"type": "integer"}}}
    }
  },
  "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {"name": {"type": "string"}}}
}}}`, field))
}

// TestSourceRecheck: rules over a served kind are checked again when its
// schema changes; one that no longer type-checks keeps its last good
// version, one that does gets a new hash (the engine restarts it).
func TestSourceRecheck(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "r.yaml"), `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: w}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget}
  when: object.spec.size > 1
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}}
`)
	doc := servedWidget("size")
	fetches := 0
	served := kinds.NewServed(func(gv schema.GroupVersion) ([]byte, string, error) {
		fetches++
		if gv.Group != "test.syncloop.dev" {
			return nil, "", nil
		}
		return doc, fmt.Sprintf("tag-%d", len(doc)), nil
	}, kinds.Builtin())
	gv := schema.GroupVersion{Group: "test.syncloop.dev", Version: "v1"}
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.UseSchemas(served)
	src := NewSource(l, []string{dir})
	st := src.Load()
	if len(st.Errors) != 0 || st.Set.Get("w") == nil {
		t.Fatalf("first load: errors %v", st.Errors)
	}
	first := st.Set.Get("w")

	// Without Forget and Invalidate nothing is fetched or parsed again.
	doc = servedWidget("count")
	if st := src.Load(); st.Changed || fetches != 1 {
		t.Fatalf("load without changes: changed %v, %d fetches", st.Changed, fetches)
	}

	if served.Stale("test.syncloop.dev", map[schema.GroupVersion]string{gv: fmt.Sprintf("tag-%d", len(servedWidget("size")))}) {
		t.Error("the document read is stale before it changed")
	}
	if !served.Stale("test.syncloop.dev", map[schema.GroupVersion]string{gv: fmt.Sprintf("tag-%d", len(doc))}) ||
		!served.Stale("test.syncloop.dev", map[schema.GroupVersion]string{}) {
		t.Error("the document read is not stale once the server serves another, or none")
	}
	served.Forget("test.syncloop.dev")
	src.Invalidate()
	st = src.Load()
	if !st.Changed || st.Set.Get("w") != first {
		t.Errorf("spec.size gone: changed %v, rule in force is not the last good one", st.Changed)
	}
	if len(st.Errors) != 1 || !st.Errors[0].LastGood || !strings.Contains(st.Errors[0].Error(), `test.syncloop.dev/v1.Widget.spec has no field "size"`) {
		t.Errorf("spec.size gone: errors %v", st.Errors)
	}

	// The field is back, next to another: the rule loads, with a new hash.
	doc = []byte(strings.Replace(string(servedWidget("size")), `"size": {"type": "integer"}`, `"size": {"type": "integer"}, "colour": {"type": "string"}`, 1))
	served.Forget("test.syncloop.dev")
	src.Invalidate()
	st = src.Load()
	if len(st.Errors) != 0 || st.Set.Get("w") == nil {
		t.Fatalf("spec.size back: errors %v", st.Errors)
	}
	if st.Set.Get("w").Hash == first.Hash {
		t.Error("the rule's hash did not change with its trigger's schema: the engine would keep the old compiled rule")
	}
}

// TestChangeBeforeTheWatchStarts: a file changed after the first Load but
// before the watcher's watches are in place is loaded all the same.
func TestChangeBeforeTheWatchStarts(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, doc("r", 1))
	src := newSource(t, dir)
	if st := src.Load(); workers(st.Set) != "r=1" {
		t.Fatalf("first load: %q", workers(st.Set))
	}
	write(t, f, doc("r", 2)) // before Run: no watch sees it
	ch := make(chan Status, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	w := NewWatcher(src, 50*time.Millisecond)
	go func() {
		defer close(done)
		if err := w.Run(ctx, func(st Status) { ch <- st }); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	next(t, ch, "r=2")
}

// flakyCRDs is a CRDSource that fails its first reads, as an API server
// that is restarting does, then finds no CRD.
type flakyCRDs struct {
	mu    sync.Mutex
	fails int
}

func (f *flakyCRDs) CRD(string) (*unstructured.Unstructured, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails > 0 {
		f.fails--
		return nil, errors.New("connection refused")
	}
	return nil, nil
}

// apiDoc is a rule that defines a kind: loading it reads the served CRD.
func apiDoc(workers int) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: api}
spec:
  api:
    apiVersion: example.com/v1
    kind: Thing
    spec:
      size: integer
  resources: []
  workers: %d
`, workers)
}

// TestRetryAfterClusterError: a rule file that fails to load because the
// cluster could not be read (the served CRD of the kind it defines) is
// not the file's fault: its last good version stays, and it is loaded
// again with backoff — without any change to the file — until it loads.
// A file that is wrong is not retried.
func TestRetryAfterClusterError(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, apiDoc(1))
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	crds := &flakyCRDs{}
	l.UseServedCRDs(crds, true)
	src := NewSource(l, []string{dir})
	if st := src.Load(); workers(st.Set) != "api=1" || st.Retry {
		t.Fatalf("first load: %s, retry %v", workers(st.Set), st.Retry)
	}

	crds.fails = 2
	write(t, f, apiDoc(2))
	st := src.Load()
	if workers(st.Set) != "api=1" || len(st.Errors) != 1 || !st.Errors[0].LastGood || !st.Retry || !rules.IsRetryable(st.Errors[0].Err) {
		t.Fatalf("the cluster unreadable: %s, errors %v, retry %v; want api=1 kept and a retry", workers(st.Set), st.Errors, st.Retry)
	}

	// The watcher loads it again by itself, with backoff, until it loads.
	ch := make(chan Status, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = NewWatcher(src, 10*time.Millisecond).Run(ctx, func(st Status) { ch <- st })
	}()
	if st := next(t, ch, "api=2"); len(st.Errors) != 0 || st.Retry {
		t.Errorf("loaded at last: errors %v, retry %v", st.Errors, st.Retry)
	}
	cancel()
	<-done

	write(t, f, broken)
	if st := src.Load(); st.Retry {
		t.Errorf("a broken file is retried: %v", st.Errors)
	}
}

// TestLastGoodFromEarlier: a file that does not load when the Source is
// new — a syncloop started while it is broken — has the version an
// earlier process ran put in force (UseLastGood), said so in its error;
// a failure to ask is tried again at the next load; once the file is
// fixed its own version is in force.
func TestLastGoodFromEarlier(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, broken)
	src := newSource(t, dir)
	earlier, err := newSource(t).loader.Parse("revision r-1", []byte(doc("r", 7)))
	if err != nil {
		t.Fatal(err)
	}
	asked, fail, keepOwn := 0, true, false
	var current *rules.File // what the last ask said was in force
	src.UseLastGood(func(path string, c *rules.File) (*rules.File, error) {
		asked, current = asked+1, c
		if path != f {
			t.Errorf("asked for %s", path)
		}
		if fail {
			return nil, &rules.Retryable{Err: errors.New("the API server is down")}
		}
		if c != nil && keepOwn {
			return c, nil // the revisions know no newer version than this process's
		}
		return &rules.File{Path: path, Rules: earlier.Rules}, nil
	})
	if st := src.Load(); workers(st.Set) != "" || !st.Retry || len(st.Errors) != 1 || st.Errors[0].LastGood {
		t.Fatalf("revisions unreadable: %s, retry %v, errors %v; want nothing in force and a retry", workers(st.Set), st.Retry, st.Errors)
	}
	fail = false
	st := src.Load()
	if workers(st.Set) != "r=7" || st.Retry || len(st.Errors) != 1 || !st.Errors[0].Recovered || !strings.Contains(st.Errors[0].Error(), "recovered from the rules' revisions") {
		t.Fatalf("recovered: %s, retry %v, errors %v; want r=7 from the revisions", workers(st.Set), st.Retry, st.Errors)
	}
	src.Load()
	if asked != 2 || current != nil {
		t.Errorf("asked %d times (the last with %v in force), want twice with nothing in force: once refused, once answered", asked, current)
	}
	write(t, f, doc("r", 8))
	if st := src.Load(); workers(st.Set) != "r=8" || len(st.Errors) != 0 {
		t.Errorf("fixed: %s, errors %v", workers(st.Set), st.Errors)
	}
	write(t, f, broken)
	keepOwn = true
	if st := src.Load(); workers(st.Set) != "r=8" || len(st.Errors) != 1 || st.Errors[0].Recovered || !st.Errors[0].LastGood {
		t.Errorf("broken again: %s, errors %v; want this process's last good version", workers(st.Set), st.Errors)
	}
	if asked != 3 || current == nil || workers(mustSet(t, current)) != "r=8" {
		t.Errorf("asked %d times, the last with %v in force; want a third ask, with r=8", asked, current)
	}
	// Broken otherwise, when the revisions hold a version newer than this
	// process's (another replica loaded it): theirs runs.
	write(t, f, broken+"\n# still broken")
	keepOwn = false
	if st := src.Load(); workers(st.Set) != "r=7" || len(st.Errors) != 1 || !st.Errors[0].Recovered {
		t.Errorf("broken, a newer version recorded: %s, errors %v; want r=7 from the revisions", workers(st.Set), st.Errors)
	}
	// A version recorded after the ask (another replica's recording,
	// retried) is asked for again only after AskAgain, the file unchanged.
	later, err := newSource(t).loader.Parse("revision r-2", []byte(doc("r", 9)))
	if err != nil {
		t.Fatal(err)
	}
	earlier = later
	if st := src.Load(); workers(st.Set) != "r=7" || st.Changed {
		t.Errorf("unchanged, not asked again: %s, changed %v; want r=7 as it was", workers(st.Set), st.Changed)
	}
	if !src.AskAgain() {
		t.Error("AskAgain with a broken file reports nothing to ask")
	}
	if st := src.Load(); workers(st.Set) != "r=9" || !st.Changed || len(st.Errors) != 1 || !st.Errors[0].Recovered {
		t.Errorf("asked again: %s, changed %v, errors %v; want r=9 from the revisions, a change", workers(st.Set), st.Changed, st.Errors)
	}
	write(t, f, doc("r", 10))
	if st := src.Load(); workers(st.Set) != "r=10" || src.AskAgain() {
		t.Errorf("fixed: %s, and AskAgain reports a broken file", workers(st.Set))
	}
}

// mustSet is the set of f's rules.
func mustSet(t *testing.T, f *rules.File) *rules.Set {
	t.Helper()
	set, err := rules.NewSet(f)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// fnDoc is a rule whose resource's children come from module fn.wasm.
const fnDoc = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: fn}
spec:
  watch: {apiVersion: v1, kind: ConfigMap}
  resources:
    - id: out
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      function: {wasm: fn.wasm}
`

// module is a WASI command that exits at once; extra custom-section bytes
// make another module of the same behaviour.
func module(extra byte) []byte {
	return []byte{0, 'a', 's', 'm', 1, 0, 0, 0,
		0x00, 0x03, 0x01, 'x', extra, // a custom section "x" holding extra
		0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02, 0x01, 0x00,
		0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00,
		0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b}
}

// TestModuleChangeReloads: a rule file whose module beside it changes is
// parsed again, its rule a new version (another hash); a module that
// breaks keeps the last good version; one that appears where it was
// missing brings the rule in.
func TestModuleChangeReloads(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "r.yaml"), fnDoc)
	src := newSource(t, dir)
	if st := src.Load(); st.Set.Len() != 0 || len(st.Errors) != 1 || !strings.Contains(st.Errors[0].Error(), "reading the module") {
		t.Fatalf("without its module: %d rules, errors %v", st.Set.Len(), st.Errors)
	}
	mod := filepath.Join(dir, "fn.wasm")
	if err := os.WriteFile(mod, module(1), 0o644); err != nil {
		t.Fatal(err)
	}
	st := src.Load()
	if !st.Changed || st.Set.Get("fn") == nil || len(st.Errors) != 0 {
		t.Fatalf("the module written: changed %v, errors %v", st.Changed, st.Errors)
	}
	first := st.Set.Get("fn").Hash
	if st := src.Load(); st.Changed {
		t.Error("a load without changes reported one")
	}
	if err := os.WriteFile(mod, module(2), 0o644); err != nil {
		t.Fatal(err)
	}
	st = src.Load()
	if !st.Changed || st.Set.Get("fn") == nil || st.Set.Get("fn").Hash == first {
		t.Fatalf("the module changed: changed %v, the rule's hash unchanged", st.Changed)
	}
	second := st.Set.Get("fn").Hash
	if err := os.WriteFile(mod, []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	st = src.Load()
	if r := st.Set.Get("fn"); r == nil || r.Hash != second || len(st.Errors) != 1 || !st.Errors[0].LastGood {
		t.Errorf("a broken module: errors %v; want the last good version kept", st.Errors)
	}
}

// TestFileLoadedAt: a file's version carries when its content was first
// read, the order of the versions replicas load; parsed again with the
// same bytes (a CRD changed) it keeps it, and new bytes get a later one.
func TestFileLoadedAt(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, doc("r", 1))
	src := newSource(t, dir)
	before := time.Now()
	st := src.Load()
	first := st.Set.Files()[0].LoadedAt
	if first.Before(before) || first.After(time.Now()) {
		t.Fatalf("loaded at %v, not during the load", first)
	}
	src.Invalidate()
	if st := src.Load(); !st.Set.Files()[0].LoadedAt.Equal(first) {
		t.Errorf("parsed again, unchanged: loaded at %v, want %v as first read", st.Set.Files()[0].LoadedAt, first)
	}
	write(t, f, doc("r", 2))
	if st := src.Load(); !st.Set.Files()[0].LoadedAt.After(first) {
		t.Errorf("changed: loaded at %v, not after %v", st.Set.Files()[0].LoadedAt, first)
	}
}
