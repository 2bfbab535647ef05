package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8sdynamic "k8s.io/client-go/dynamic"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

var widgets = schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "widgets"}

func (h *harness) dynamic() k8sdynamic.Interface {
	dc, err := k8sdynamic.NewForConfig(h.env.Config())
	if err != nil {
		h.t.Fatal(err)
	}
	return dc
}

func (h *harness) newNamespace() string {
	h.t.Helper()
	ns, err := h.cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "eng-other-"}}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return ns.Name
}

// TestStatusFromChildren: a Widget gets a ConfigMap, and its status —
// written through the status subresource — reports the live child.
//
// API server: the status subresource of a CRD, and a child's live state.
func TestStatusFromChildren(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: widget}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  resources:
    - id: config
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-config"}
        data: {size: "${string(object.spec.size)}"}
    - id: extra
      when: "object.spec.size > 5"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-extra"}
  status:
    configName: ${children.config.metadata.name}
    configUID: ${children.config.metadata.uid}
    size: ${children.config.data.size}
    hasExtra: ${has(children.extra)}
`))
	dc := h.dynamic()
	h.createWidget("w", map[string]any{"size": int64(3)})
	status := func() map[string]any {
		st, _, _ := unstructured.NestedMap(h.widget("w").Object, "status")
		return st
	}
	h.eventually("the Widget's status", func() bool { return status()["size"] == "3" })
	cm, _ := h.configMap(h.ns, "w-config")
	st := status()
	if st["configName"] != "w-config" || st["configUID"] != string(cm.UID) || st["hasExtra"] != false {
		t.Errorf("status = %v; want the live child's name and uid %s, hasExtra false", st, cm.UID)
	}

	// A per-child `when` turning true adds the child and the status follows.
	if _, err := dc.Resource(widgets).Namespace(h.ns).Patch(t.Context(), "w", "application/merge-patch+json",
		[]byte(`{"spec":{"size":7}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the extra child and the status to follow", func() bool {
		_, extra := h.configMap(h.ns, "w-extra")
		st := status()
		return extra && st["size"] == "7" && st["hasExtra"] == true
	})
}

// TestCrossNamespaceCleanup: children in other namespaces (no
// ownerReference possible) are deleted by syncloop when their trigger goes,
// also when the trigger went while syncloop was not running.
//
// API server: deletes with UID preconditions across namespaces (no
// ownerReference possible).
func TestCrossNamespaceCleanup(t *testing.T) {
	h := newHarness(t)
	other := h.newNamespace()
	set := h.loadRules(strings.ReplaceAll(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: spread}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: spread}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}", namespace: OTHER}
`, "OTHER", other))
	h.start(set)
	h.createCM("live", map[string]string{"spread": "x"}, nil)
	h.createCM("while-down", map[string]string{"spread": "x"}, nil)
	h.eventually("both copies", func() bool {
		_, a := h.configMap(other, "live")
		_, b := h.configMap(other, "while-down")
		return a && b
	})
	cp, _ := h.configMap(other, "live")
	if len(cp.OwnerReferences) != 0 {
		t.Errorf("a child in another namespace has ownerReferences %v", cp.OwnerReferences)
	}

	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "live", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the cross-namespace copy pruned", func() bool { _, ok := h.configMap(other, "live"); return !ok })

	// syncloop stops; a trigger is deleted; syncloop starts again.
	h.stop()
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "while-down", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.start(set)
	h.eventually("the copy of a trigger deleted while syncloop was down pruned", func() bool {
		_, ok := h.configMap(other, "while-down")
		return !ok
	})
}

// TestKindInstalledLater: a rule whose trigger kind is not served waits,
// is reported not ready, and starts working once the CRD is installed.
//
// API server: discovery of a CRD installed while running, and its informer
// starting.
func TestKindInstalledLater(t *testing.T) {
	h := newHarness(t)
	set := h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: gadget}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Gadget, namespace: NS}
  resources:
    - id: config
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-config"}}
`)
	env := testenv.Get(t)
	h.startUnready(set)
	h.eventually("the rule to report that it waits for Gadget", func() bool {
		st := h.engine.States()
		return len(st) == 1 && st[0].State == StateWaiting && strings.Contains(st[0].Detail, "Gadget")
	})
	if h.engine.Ready() {
		t.Fatal("the engine is ready while a rule waits for its kind")
	}
	if _, err := env.InstallCRDs(t.Context(), filepath.Join("testdata", "gadgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	h.eventually("the rule to run once the CRD is served", func() bool { return h.engine.Ready() })
	g := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.syncloop.dev/v1", "kind": "Gadget", "metadata": map[string]any{"name": "g"},
	}}
	gadgets := schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "gadgets"}
	if _, err := h.dynamic().Resource(gadgets).Namespace(h.ns).Create(t.Context(), g, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the Gadget's child", func() bool { _, ok := h.configMap(h.ns, "g-config"); return ok })
}

func ruleYAML(name, selector, field string) string {
	fs := ""
	if field != "" {
		fs = ", fieldSelector: \"" + field + "\""
	}
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "%s"%s}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-%s"}}
`, name, selector, fs, name)
}

// TestInformerSharing: rules with the same watch share its informer; each
// rule's child informer holds its own children only, so a rule's cache
// holds nothing another rule made and a removed rule's children leave the
// caches (though not the cluster).
//
// API server: watches: one connection per WatchKey, label selectors on
// child informers.
func TestInformerSharing(t *testing.T) {
	h := newHarness(t)
	a := ruleYAML("share-a", "team=x", "")
	b := ruleYAML("share-b", "team=x", "")
	c := ruleYAML("share-c", "team=y", "")
	h.start(h.loadRules(a + "---\n" + b + "---\n" + c))
	// share-a and share-b: one trigger informer; share-c: another; a
	// ConfigMap child informer per rule.
	if n := h.engine.Informers(); n != 5 {
		t.Errorf("%d informers for rules a, b (same watch) and c, want 5: %v", n, h.engine.actors.keys())
	}
	h.createCM("t", map[string]string{"team": "x"}, nil)
	h.eventually("both rules on the shared informer to act", func() bool {
		_, ca := h.configMap(h.ns, "t-share-a")
		_, cb := h.configMap(h.ns, "t-share-b")
		return ca && cb
	})
	cached := h.loop("share-a").rc.w.children[schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}].sub.Indexer().List()
	var names []string
	for _, o := range cached {
		names = append(names, o.(object).GetName())
	}
	if !slices.Equal(names, []string{"t-share-a"}) {
		t.Errorf("share-a's child cache holds %q, want its own child t-share-a only", names)
	}

	h.engine.Enforce(t.Context(), h.loadRules(a+"---\n"+c))
	if n := h.engine.Informers(); n != 4 {
		t.Errorf("after removing share-b (its watch still used by share-a): %d informers, want 4: %v", n, h.engine.actors.keys())
	}
	if _, ok := h.configMap(h.ns, "t-share-b"); !ok {
		t.Error("removing a rule deleted its child; it must stay")
	}
	h.engine.Enforce(t.Context(), h.loadRules(a))
	if n := h.engine.Informers(); n != 2 {
		t.Errorf("after removing share-c: %d informers, want 2", n)
	}
	h.engine.Enforce(t.Context(), nil)
	if n := h.engine.Informers(); n != 0 {
		t.Errorf("with no rules: %d informers, want 0", n)
	}
}

// TestFieldSelector: the field selector reaches the API server; only the
// named object is a trigger.
//
// API server: field selectors evaluated by the server.
func TestFieldSelector(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(ruleYAML("fields", "f", "metadata.name=chosen")))
	h.createCM("other", map[string]string{"f": "1"}, nil)
	h.createCM("chosen", map[string]string{"f": "1"}, nil)
	h.eventually("the chosen trigger's child", func() bool { _, ok := h.configMap(h.ns, "chosen-fields"); return ok })
	if _, ok := h.configMap(h.ns, "other-fields"); ok {
		t.Error("an object outside the field selector got a child")
	}
	lists := h.counter.Requests(func(r testenv.Request) bool {
		return strings.Contains(r.Query, "fieldSelector=metadata.name%3Dchosen")
	})
	if len(lists) == 0 {
		t.Error("no request carried the field selector: it was not sent to the API server")
	}
}

// TestConflictBetweenRules: two rules that render the same object (both
// forcing field conflicts, the default), neither caching the other's
// children. One owns it; the other reports a ChildConflict Event and does
// not take it — no ping-pong.
//
// API server: server-side apply conflicts between two field managers.
func TestConflictBetweenRules(t *testing.T) {
	h := newHarness(t)
	rule := func(name, selector string) string {
		return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "%s"}
  resources:
    - id: shared
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: shared}, data: {by: %s}}
  resyncPeriod: 1s
`, name, selector, name)
	}
	h.start(h.loadRules(rule("first", "first") + "---\n" + rule("second", "second")))
	h.createCM("a", map[string]string{"first": "1"}, nil)
	h.eventually("the shared object owned by rule first", func() bool {
		cm, ok := h.configMap(h.ns, "shared")
		return ok && cm.Labels[rules.LabelRule] == "first"
	})
	h.createCM("b", map[string]string{"second": "1"}, nil)
	h.waitForEventWithin(30*time.Second, render.ReasonChildConflict, "b", `is a child of rule "first"`)
	before, _ := h.configMap(h.ns, "shared")
	c := h.loop("second")
	r0 := c.resyncs.Load()
	h.eventually("two resyncs of the losing rule", func() bool { return c.resyncs.Load() >= r0+2 })
	after, _ := h.configMap(h.ns, "shared")
	if after.ResourceVersion != before.ResourceVersion || after.Labels[rules.LabelRule] != "first" {
		t.Errorf("the shared object changed (rv %s → %s, owner %s): the rules fight over it",
			before.ResourceVersion, after.ResourceVersion, after.Labels[rules.LabelRule])
	}
}

// TestShutdownLeavesNoGoroutines: after Run returns, nothing of the engine,
// its informers or its workqueues runs.
//
// API server: live watches, whose goroutines must all end.
func TestShutdownLeavesNoGoroutines(t *testing.T) {
	h := newHarness(t)
	h.alone = true
	h.start(h.loadRules(copyRule))
	h.createCM("src", map[string]string{"copy": "yes"}, map[string]string{"teams": "a"})
	h.eventually("children", func() bool { _, ok := h.configMap(h.ns, "src-team-a"); return ok })
	h.stop()
	if !h.within(30*time.Second, func() bool { return len(leftovers()) == 0 }) {
		left := append(leftovers(), "(none left now)")
		t.Fatalf("%d engine, informer or workqueue goroutines still run; the first:\n%s", len(left)-1, left[0])
	}
}

// leftovers lists goroutines running engine, dynamic, informer or
// workqueue code.
func leftovers() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		// The tests' own goroutines are not the engine's: this one, the
		// others between tests, and those waiting to run in parallel.
		if strings.Contains(g, "TestShutdownLeavesNoGoroutines") || strings.Contains(g, "testing.(*T).Parallel") ||
			strings.Contains(g, "testing.tRunner") && !strings.Contains(g, "syncloop/engine.(*") {
			continue
		}
		for _, marker := range []string{"syncloop/engine.", "syncloop/dynamic.", "tools/cache.", "util/workqueue."} {
			if strings.Contains(g, marker) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// startUnready starts the engine without waiting for it to be ready.
func (h *harness) startUnready(set *rules.Set) {
	h.startWith(set, false)
}

// TestDeletionPolicyOrphan: with Orphan, children stay when their trigger
// goes away or its `when` turns false.
//
// API server: children without ownerReferences surviving their trigger's
// deletion.
func TestDeletionPolicyOrphan(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: keep}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: keep}
  when: "object.metadata.labels.keep == 'yes'"
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-kept"}}
  deletionPolicy: Orphan
`))
	h.createCM("a", map[string]string{"keep": "yes"}, nil)
	h.createCM("b", map[string]string{"keep": "yes"}, nil)
	// b will be deleted while a finalizer holds it: syncloop sees a trigger
	// being deleted, and the garbage collector leaves its child alone (with
	// b gone for good, a child the collector had not seen yet would be
	// collected as dangling, whatever the propagation policy).
	h.updateCM("b", func(cm *corev1.ConfigMap) { cm.Finalizers = append(cm.Finalizers, "test.syncloop.dev/hold") })
	t.Cleanup(func() {
		_, err := h.cs.CoreV1().ConfigMaps(h.ns).Patch(context.Background(), "b", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err != nil {
			t.Error(err)
		}
	})
	c := h.loop("keep")
	h.eventually("both children, and the rule idle", func() bool {
		_, a := h.configMap(h.ns, "a-kept")
		_, b := h.configMap(h.ns, "b-kept")
		return a && b && c.idle()
	})
	k0 := c.reconciles.Load()
	h.updateCM("a", func(cm *corev1.ConfigMap) { cm.Labels["keep"] = "no" }) // when turns false
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("both triggers reconciled", func() bool {
		obj, ok, _ := c.watches.trigger.Indexer().GetByKey(h.ns + "/b")
		deleting := ok && obj.(object).GetDeletionTimestamp() != nil
		return deleting && c.reconciles.Load() >= k0+2 && c.idle()
	})
	if _, ok := h.configMap(h.ns, "a-kept"); !ok {
		t.Error("Orphan: the child of a trigger whose when turned false was deleted")
	}
	if _, ok := h.configMap(h.ns, "b-kept"); !ok {
		t.Error("Orphan: the child of a deleted trigger was deleted")
	}
}

// TestMaxRetries: a trigger that keeps failing is dropped after maxRetries
// attempts (with a Failed event each time), until its next change.
//
// API server: a write the server refuses, and Events recorded on the
// trigger.
func TestMaxRetries(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: flaky}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: flaky}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.data.name}"}}
  maxRetries: 3
  resyncPeriod: "0"
  rateLimit: {baseDelay: 10ms, maxDelay: 50ms}
`))
	c := h.loop("flaky")
	h.createCM("bad", map[string]string{"flaky": "1"}, map[string]string{"other": "x"}) // data.name missing
	h.eventually("three failed attempts", func() bool { return c.reconciles.Load() >= 3 })
	// With backoff capped at 50ms, a fourth attempt would come quickly:
	// watch a second of quiet.
	k := c.reconciles.Load()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && c.reconciles.Load() == k {
		time.Sleep(20 * time.Millisecond)
	}
	if got := c.reconciles.Load(); got != 3 {
		t.Errorf("%d attempts, want exactly maxRetries = 3", got)
	}
	// The next change brings the trigger back, and now it renders.
	h.updateCM("bad", func(cm *corev1.ConfigMap) { cm.Data["name"] = "fixed" })
	h.eventually("the fixed trigger's child", func() bool { _, ok := h.configMap(h.ns, "fixed"); return ok })
}

// TestSameRuleNameElsewhereIsLeftAlone: children whose trigger lies outside
// a rule's watch (here: a same-named rule of another syncloop, watching
// another namespace) are never swept or pruned by it.
//
// API server: label selectors on watches across namespaces.
func TestSameRuleNameElsewhereIsLeftAlone(t *testing.T) {
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: same}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: same}
  resources:
    - id: child
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.metadata.name}-child"}}
  resyncPeriod: 1s
`
	first := newHarness(t)
	first.start(first.loadRules(rule))
	first.createCM("t", map[string]string{"same": "1"}, nil)
	first.eventually("the first syncloop's child", func() bool { _, ok := first.configMap(first.ns, "t-child"); return ok })
	first.stop()

	second := newHarness(t)
	second.start(second.loadRules(rule))
	c := second.loop("same")
	second.eventually("two resyncs (and sweeps) of the second syncloop", func() bool { return c.resyncs.Load() >= 2 && c.idle() })
	if _, ok := first.configMap(first.ns, "t-child"); !ok {
		t.Fatal("a same-named rule watching another namespace pruned a child it cannot see the trigger of")
	}
}
