package manager

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// TestRemovedFromRevisions: the rules the revisions know and a set does
// not hold are removals to do when their last version deletes its
// children on removal (or orders its teardown), until a removal is
// recorded on that version's revision; one that orphans is none, and a
// rule put back is none.
func TestRemovedFromRevisions(t *testing.T) {
	ctx := t.Context()
	c, ns, l := keeperFixture(t, testenv.Get(t).Config(), "removals-")
	rule := func(name, policy string) string {
		return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  removalPolicy: %s
  resources:
    - {id: cm, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: default}}}
---
`, name, policy)
	}
	load := func(doc string) *rules.Set {
		t.Helper()
		f, err := l.Parse("rules.yaml", []byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		set, err := rules.NewSet(f)
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	k := newRevisionKeeper(c, ns.Name, "")
	k.compile = compileRevision(l)
	both := load(rule("deletes", "Delete") + rule("orphans", "Orphan"))
	if k.keep(ctx, both, nil) {
		t.Fatal("recording the revisions failed")
	}
	names := func(set *rules.Set) string {
		t.Helper()
		removed, err := k.Removed(ctx, set)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range removed {
			out = append(out, r.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names(both); got != "" {
		t.Errorf("removed with both in force: %q", got)
	}
	empty := load("")
	if got := names(empty); got != "deletes" {
		t.Errorf("removed with none in force: %q, want deletes", got)
	}
	k.RecordRemoval(ctx, both.Get("deletes"), engine.RemovalRecord{State: engine.RemovalDone, Deleted: 1}, corev1.EventTypeNormal, "Removed", "")
	if got := names(empty); got != "" {
		t.Errorf("removed once its removal is recorded: %q, want none", got)
	}
	revs, err := Revisions(ctx, c, ns.Name, "", "deletes")
	if err != nil || len(revs) != 1 || revs[0].Removal == nil || revs[0].Removal.Deleted != 1 {
		t.Errorf("the revision's removal: %+v, %v", revs, err)
	}
}

// keeperFixture is what a test of the revisions keeps needs: clients of
// cfg, a namespace of its own (named from prefix) and a loader.
func keeperFixture(t *testing.T, cfg *rest.Config, prefix string) (*Clients, *corev1.Namespace, *rules.Loader) {
	t.Helper()
	c, err := NewClients(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := c.Core.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c, ns, l
}

// TestRemovedWithoutItsModule: a removed rule whose function's module
// this process no longer has — released once no rule in force called
// it, or never loaded since a restart — is still a removal to do: its
// removal calls no function. (Compiled as a revision to run, it would
// not compile, and its children would be left for good.)
func TestRemovedWithoutItsModule(t *testing.T) {
	ctx := t.Context()
	c, ns, l := keeperFixture(t, testenv.Get(t).Config(), "removals-")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fn.wasm"), unreachableWasm, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse(filepath.Join(dir, "rules.yaml"), []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: calls}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  removalPolicy: Delete
  resources:
    - {id: fn, kinds: [{apiVersion: v1, kind: ConfigMap}], function: {wasm: fn.wasm}}
`))
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.NewSet(f)
	if err != nil {
		t.Fatal(err)
	}
	k := newRevisionKeeper(c, ns.Name, "")
	k.compile, k.compileRemoved = compileRevision(l.ForRevisions()), compileRevision(l.ForInspection())
	if k.keep(ctx, set, nil) {
		t.Fatal("recording the revision failed")
	}
	for range 2 { // the rule removed: no rule in force calls its module
		l.ReleaseModules(ctx, nil)
	}
	if _, err := k.compile(&rules.Rule{Name: "calls"}, "r", set.Get("calls").Source); err == nil {
		t.Fatal("the module was not released")
	}
	removed, err := k.Removed(ctx, &rules.Set{})
	if err != nil || len(removed) != 1 || removed[0].Name != "calls" {
		t.Fatalf("removed %v, %v: want the rule's removal to do", removed, err)
	}
}
