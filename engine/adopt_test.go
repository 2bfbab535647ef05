package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// guardedRule makes three ConfigMaps per Widget: cfg, other, and dep, which
// reads cfg. Its status keeps the Ready condition.
const guardedRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: guarded}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  when: "object.?spec.?off.orValue(false) != true"
  resources:
    - id: cfg
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-cfg"}
        data: {size: "${string(object.spec.size)}"}
    - id: other
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-other"}
    - id: dep
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-dep"}
        data: {from: "${children.cfg.metadata.name}"}
  status:
    size: "${string(object.spec.size)}"
`

// writesTo are the engine's requests that changed, or could have changed,
// namespace/name of resource (plural): every write that did not answer 409
// Conflict (the create-only apply that found the object).
func (h *harness) writesTo(resource, namespace, name string) []testenv.Request {
	suffix := "/namespaces/" + namespace + "/" + resource + "/" + name
	return h.counter.Requests(func(r testenv.Request) bool {
		return r.IsWrite() && strings.HasSuffix(r.Path, suffix) && r.Status != 409
	})
}

// TestNeverTakesOver: an existing ConfigMap without syncloop's ownership,
// under a child's name, keeps its resourceVersion through the trigger's
// create, update, `when` turning false and deletion. The conflict is a
// ChildConflict Warning Event, Ready False ChildConflict, and
// syncloop_apply_total{action="conflict"}; the trigger's other resource is
// applied, the one that reads the conflicting one waits.
//
// API server: server-side apply's create-only precondition
// (resourceVersion "1") refused on an existing object.
func TestNeverTakesOver(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	m := &recordingMetrics{}
	h.metrics = m
	mine := h.createCM("w-cfg", map[string]string{"app": "mine"}, map[string]string{"owner": "me"})
	h.start(h.loadRules(guardedRule))
	h.createWidget("w", map[string]any{"size": int64(3)})

	h.waitForEventWithin(30e9, render.ReasonChildConflict, "w", `ConfigMap `+h.ns+`/w-cfg exists and is not syncloop's`)
	h.eventually("Ready False with reason ChildConflict", func() bool {
		c := readyCondition(h.widget("w"))
		return c != nil && c["status"] == "False" && c["reason"] == render.ReasonChildConflict
	})
	h.eventually("the other child applied", func() bool { _, ok := h.configMap(h.ns, "w-other"); return ok })
	if _, ok := h.configMap(h.ns, "w-dep"); ok {
		t.Error("w-dep, which reads the conflicting child, was applied")
	}
	if m.written("guarded", "conflict") == 0 {
		t.Error(`syncloop_apply_total{action="conflict"} not counted`)
	}
	unchanged := func(when string) {
		t.Helper()
		cm, ok := h.configMap(h.ns, "w-cfg")
		switch {
		case !ok:
			t.Fatalf("%s: the user's ConfigMap was deleted", when)
		case cm.UID != mine.UID || cm.ResourceVersion != mine.ResourceVersion:
			t.Fatalf("%s: the user's ConfigMap was written: rv %s → %s, labels %v", when, mine.ResourceVersion, cm.ResourceVersion, cm.Labels)
		}
		if w := h.writesTo("configmaps", h.ns, "w-cfg"); len(w) > 0 {
			t.Fatalf("%s: %d writes reached the user's ConfigMap: %v", when, len(w), w[0])
		}
	}
	unchanged("after the trigger's create")

	patch := func(body string) {
		t.Helper()
		if _, err := h.dynamic().Resource(widgets).Namespace(h.ns).Patch(t.Context(), "w", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(`{"spec":{"size":4}}`)
	h.eventually("the status to follow the update", func() bool {
		st, _, _ := unstructured.NestedString(h.widget("w").Object, "status", "size")
		return st == "4"
	})
	unchanged("after the trigger's update")
	// Retried with backoff, a conflict costs one read each time: only the
	// first attempt was a (refused) create.
	suffix := "/namespaces/" + h.ns + "/configmaps/w-cfg"
	refused := h.counter.Requests(func(r testenv.Request) bool { return r.Method == "PATCH" && strings.HasSuffix(r.Path, suffix) })
	reads := h.counter.Requests(func(r testenv.Request) bool { return r.Method == "GET" && strings.HasSuffix(r.Path, suffix) })
	if len(refused) != 1 || len(reads) < 2 {
		t.Errorf("%d create attempts and %d reads of the user's ConfigMap; want 1 and one per retry", len(refused), len(reads))
	}

	patch(`{"spec":{"off":true}}`)
	h.eventually("the other child pruned once when is false", func() bool { _, ok := h.configMap(h.ns, "w-other"); return !ok })
	unchanged("after when turned false")

	patch(`{"spec":{"off":false}}`)
	h.eventually("the other child back", func() bool { _, ok := h.configMap(h.ns, "w-other"); return ok })
	if err := h.dynamic().Resource(widgets).Namespace(h.ns).Delete(t.Context(), "w", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the other child pruned once the trigger is gone", func() bool { _, ok := h.configMap(h.ns, "w-other"); return !ok })
	unchanged("after the trigger's deletion")
	// The garbage collector may delete w-other (its ownerReference) before
	// syncloop handles the trigger's deletion: wait for that, not for it.
	h.eventually("the memory of the trigger's conflicts to go with it", func() bool {
		_, _, _, left := h.loop("guarded").rc.writes.remembered()
		return left == 0
	})
}

// TestAdopt: adopt: true on the resource, or the annotation
// syncloop.dev/adopt: <rule> on the object, lets syncloop take over an
// object it did not create; it is then the trigger's child: labelled,
// repaired and pruned. Another rule's child is not adopted even so.
//
// API server: server-side apply taking over an object's fields, and its
// managedFields.
func TestAdopt(t *testing.T) {
	h := newHarness(t)
	h.createCM("a-copy", nil, map[string]string{"old": "yes"})
	h.createCM("b-copy", nil, map[string]string{"old": "yes"})
	h.updateCM("b-copy", func(cm *corev1.ConfigMap) { cm.Annotations = map[string]string{rules.AnnotationAdopt: "annotated"} })
	h.createCM("c-copy", map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "someone-else"}, nil)
	rule := func(name, selector, adopt string) string {
		return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: %s}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "%s"}
  resources:
    - id: copy
      %s
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: {by: %s}
`, name, selector, adopt, name)
	}
	h.start(h.loadRules(rule("adopting", "adopt in (a,c)", "adopt: true") + "---\n" + rule("annotated", "annotated", "")))
	h.createCM("a", map[string]string{"adopt": "a"}, nil)
	h.createCM("b", map[string]string{"annotated": "yes"}, nil)
	h.createCM("c", map[string]string{"adopt": "c"}, nil)
	for _, c := range []struct{ name, rule string }{{"a-copy", "adopting"}, {"b-copy", "annotated"}} {
		h.eventually(c.name+" adopted", func() bool {
			cm, ok := h.configMap(h.ns, c.name)
			return ok && cm.Labels[rules.LabelRule] == c.rule && cm.Data["by"] == c.rule && len(cm.OwnerReferences) == 1
		})
	}
	h.waitForEventWithin(30e9, render.ReasonChildConflict, "c", `is a child of rule "someone-else"`)
	if cm, _ := h.configMap(h.ns, "c-copy"); cm.Labels[rules.LabelRule] != "someone-else" {
		t.Errorf("another rule's child was adopted: labels %v", cm.Labels)
	}

	// Adopted, it is a child like any other: repaired, and pruned with its
	// trigger.
	h.updateCM("a-copy", func(cm *corev1.ConfigMap) { cm.Data["by"] = "edited" })
	h.eventually("drift on the adopted child repaired", func() bool { cm, _ := h.configMap(h.ns, "a-copy"); return cm.Data["by"] == "adopting" })
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the adopted child deleted with its trigger", func() bool { _, ok := h.configMap(h.ns, "b-copy"); return !ok })
}

// cloneRule copies the Secret regcred of namespace SRC into every
// namespace labelled clone=LABEL — SRC's own included, where the copy is
// the source itself. It adopts existing copies: a lookup's source is
// never written even so.
const cloneRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: clone}
spec:
  watch: {apiVersion: v1, kind: Namespace, labelSelector: "clone=LABEL"}
  WHEN
  lookups:
    - id: source
      apiVersion: v1
      kind: Secret
      namespace: SRC
      name: regcred
  resources:
    - id: copy
      when: lookups.source != null
      adopt: true
      template:
        apiVersion: v1
        kind: Secret
        type: ${lookups.source.type}
        metadata: {name: regcred, namespace: "${object.metadata.name}"}
        data: ${lookups.source.data}
`

// TestCloneLeavesItsSource: a rule that copies a Secret into every
// namespace, the source's own included, never applies the source (a
// conflict for that trigger); when a hot reload swaps in an exclude list
// with the source's namespace on it, the source and every other
// namespace's copy stay.
//
// API server: cross-namespace reads and applies, and the object's own
// managedFields.
func TestCloneLeavesItsSource(t *testing.T) {
	h := newHarness(t)
	m := &recordingMetrics{}
	h.metrics = m
	label := h.ns
	var namespaces []string
	for range 3 {
		ns := h.newNamespace()
		h.labelNamespace(ns, "clone", label)
		namespaces = append(namespaces, ns)
	}
	src := namespaces[0]
	source, err := h.cs.CoreV1().Secrets(src).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred"}, Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"k": []byte("v")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rule := func(when string) string {
		return strings.NewReplacer("LABEL", label, "SRC", src, "WHEN", when).Replace(cloneRule)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "clone.yaml")
	writeRule(t, path, rule(""))
	h.start(h.watchRules(dir))
	for _, ns := range namespaces[1:] {
		h.eventually("the copy in "+ns, func() bool {
			s, err := h.cs.CoreV1().Secrets(ns).Get(t.Context(), "regcred", metav1.GetOptions{})
			return err == nil && string(s.Data["k"]) == "v"
		})
	}
	h.eventually("the source's own namespace a conflict", func() bool { return m.written("clone", "conflict") > 0 })

	c := h.loop("clone")
	writeRule(t, path, rule(fmt.Sprintf(`when: "!(object.metadata.name in ['kube-system', 'default', 'kube-public', '%s'])"`, src)))
	h.eventually("the new rule in force and idle", func() bool {
		nc := h.loop("clone") // the excluded namespace is not even queued
		return nc != c && nc.reconciles.Load() >= 2 && nc.idle()
	})
	s, err := h.cs.CoreV1().Secrets(src).Get(t.Context(), "regcred", metav1.GetOptions{})
	switch {
	case err != nil:
		t.Fatalf("the source is gone: %v", err)
	case s.ResourceVersion != source.ResourceVersion || len(s.Labels) > 0 || len(s.OwnerReferences) > 0:
		t.Errorf("the source was written: rv %s → %s, labels %v, owners %v", source.ResourceVersion, s.ResourceVersion, s.Labels, s.OwnerReferences)
	}
	for _, ns := range namespaces[1:] {
		if s, err := h.cs.CoreV1().Secrets(ns).Get(t.Context(), "regcred", metav1.GetOptions{}); err != nil || string(s.Data["k"]) != "v" {
			t.Errorf("the copy in %s did not stay: %v", ns, err)
		}
	}
	if w := h.writesTo("secrets", src, "regcred"); len(w) > 0 {
		t.Errorf("%d writes reached the source: %v", len(w), w[0])
	}
}

func (h *harness) labelNamespace(ns, k, v string) {
	h.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, k, v)
	if _, err := h.cs.CoreV1().Namespaces().Patch(h.t.Context(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		h.t.Fatal(err)
	}
}

// TestNoTakeoverProperty: over random mixes of objects already under the
// children's names — none, syncloop's own for this trigger, unlabelled,
// another rule's, another trigger's, annotated for adoption, annotated
// for another rule — with adopt on or off, syncloop writes (and deletes)
// exactly the objects it owns or may adopt, through the triggers' create,
// update and deletion.
//
// API server: server-side apply's preconditions against objects of every
// ownership, as the server stores them.
func TestNoTakeoverProperty(t *testing.T) {
	seed := uint64(os.Getpid())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	h := newHarness(t)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: prop}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "prop"}
  resources:
    - id: plain
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-plain"}
        data: {gen: "${object.data.gen}"}
    - id: adopting
      adopt: true
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-adopting"}
        data: {gen: "${object.data.gen}"}
`))
	type kind struct {
		name        string
		labels, ann func(trigger string) map[string]string
		// writable by a resource without adopt, and with it.
		plain, adopting bool
	}
	own := func(tr string) map[string]string {
		return map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "prop", rules.LabelOwnerUID: "old"}
	}
	ownerOf := func(tr string) map[string]string {
		return map[string]string{rules.AnnotationOwner: "v1/ConfigMap/" + h.ns + "/" + tr}
	}
	none := func(string) map[string]string { return nil }
	kinds := []kind{
		{name: "absent"},
		{name: "own", labels: own, ann: ownerOf, plain: true, adopting: true},
		{name: "unlabelled", labels: func(string) map[string]string { return map[string]string{"team": "x"} }, ann: none, adopting: true},
		{name: "other-rule", labels: func(string) map[string]string {
			return map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "not-prop"}
		}, ann: ownerOf},
		// A trigger this rule does not watch (another namespace): its
		// child is not this rule's to write, repair or prune.
		{name: "other-trigger", labels: own, ann: func(string) map[string]string {
			return map[string]string{rules.AnnotationOwner: "v1/ConfigMap/elsewhere/someone"}
		}},
		{name: "annotated", labels: none, ann: func(string) map[string]string { return map[string]string{rules.AnnotationAdopt: "prop"} }, plain: true, adopting: true},
		{name: "annotated-other", labels: none, ann: func(string) map[string]string { return map[string]string{rules.AnnotationAdopt: "nope"} }, adopting: true},
		{name: "helm", labels: func(string) map[string]string { return map[string]string{rules.LabelManagedBy: "Helm"} }, ann: none, adopting: true},
	}
	type existing struct {
		name  string
		kind  kind
		allow bool
		uid   types.UID
		rv    string
	}
	var objs []*existing
	var triggers []string
	const n = 24
	for i := range n {
		tr := fmt.Sprintf("t%02d", i)
		triggers = append(triggers, tr)
		for _, res := range []string{"plain", "adopting"} {
			k := kinds[rng.IntN(len(kinds))]
			if k.name == "absent" {
				continue
			}
			var ann map[string]string
			if k.ann != nil {
				ann = k.ann(tr)
			}
			cm, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(t.Context(), &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: tr + "-" + res, Labels: k.labels(tr), Annotations: ann},
				Data:       map[string]string{"gen": "user"}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			allow := k.plain
			if res == "adopting" {
				allow = k.adopting
			}
			objs = append(objs, &existing{name: cm.Name, kind: k, allow: allow, uid: cm.UID, rv: cm.ResourceVersion})
		}
	}
	for _, tr := range triggers {
		h.createCM(tr, map[string]string{"prop": "yes"}, map[string]string{"gen": "1"})
	}
	c := h.loop("prop")
	converged := func(gen string) {
		t.Helper()
		h.eventually("generation "+gen+" applied where allowed", func() bool {
			for _, o := range objs {
				cm, ok := h.configMap(h.ns, o.name)
				if o.allow && (!ok || cm.Data["gen"] != gen) {
					return false
				}
			}
			return c.idle()
		})
	}
	check := func(when string, deleted bool) {
		t.Helper()
		for _, o := range objs {
			cm, ok := h.configMap(h.ns, o.name)
			switch {
			case o.allow && deleted && ok:
				t.Errorf("%s: %s (%s) not pruned with its trigger", when, o.name, o.kind.name)
			case !o.allow && !ok:
				t.Errorf("%s: %s (%s) was deleted", when, o.name, o.kind.name)
			case !o.allow && (cm.UID != o.uid || cm.ResourceVersion != o.rv):
				t.Errorf("%s: %s (%s) was written: rv %s → %s", when, o.name, o.kind.name, o.rv, cm.ResourceVersion)
			case !o.allow && len(h.writesTo("configmaps", h.ns, o.name)) > 0:
				t.Errorf("%s: a write reached %s (%s)", when, o.name, o.kind.name)
			}
		}
	}
	converged("1")
	check("after create", false)
	for _, tr := range triggers {
		h.updateCM(tr, func(cm *corev1.ConfigMap) { cm.Data["gen"] = "2" })
	}
	converged("2")
	check("after update", false)
	for _, tr := range triggers {
		if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), tr, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.eventually("the children allowed pruned", func() bool {
		for _, o := range objs {
			if _, ok := h.configMap(h.ns, o.name); o.allow && ok {
				return false
			}
		}
		return c.idle()
	})
	check("after delete", true)
}

// TestTwoInstallations: two installations of syncloop in one cluster, each
// with a rule named copy. Where both match a trigger, the one that made
// the child keeps it and the other reports a conflict; neither's sweep
// sees the other's children, so neither ever writes or deletes them —
// through resyncs, and the triggers' deletion.
//
// API server: label selectors on the child informers, and apply conflicts
// between field managers.
func TestTwoInstallations(t *testing.T) {
	a := newHarness(t) // the default installation
	b := &harness{t: t, env: a.env, cs: a.cs, ns: a.ns, counter: &testenv.RequestCounter{}, updates: make(chan *rules.Set), installation: "team-b", shared: a.shared}
	mb := &recordingMetrics{}
	b.metrics = mb
	rule := func(selector string) string {
		return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: copy}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "%s"}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: ${object.?data.orValue({})}
  resyncPeriod: 1s
`, selector)
	}
	// a watches copy in (a, both), b watches copy in (b, both).
	a.start(a.loadRules(rule("copy in (a,both)")))
	for _, tr := range []struct{ name, v string }{{"ta", "a"}, {"shared", "both"}} {
		a.createCM(tr.name, map[string]string{"copy": tr.v}, map[string]string{"k": "1"})
	}
	for _, name := range []string{"ta-copy", "shared-copy"} {
		a.eventually(name+" made by the default installation", func() bool { _, ok := a.configMap(a.ns, name); return ok })
	}
	before := map[string]*corev1.ConfigMap{}
	for _, name := range []string{"ta-copy", "shared-copy"} {
		before[name], _ = a.configMap(a.ns, name)
	}

	b.start(b.loadRules(rule("copy in (b,both)")))
	a.createCM("tb", map[string]string{"copy": "b"}, map[string]string{"k": "1"})
	b.eventually("tb-copy made by installation team-b", func() bool {
		cm, ok := b.configMap(b.ns, "tb-copy")
		return ok && cm.Labels[rules.LabelInstallation] == "team-b"
	})
	b.eventually("the shared trigger a conflict for team-b", func() bool { return mb.written("copy", "conflict") > 0 })
	if cm, _ := a.configMap(a.ns, "tb-copy"); len(cm.ManagedFields) != 1 || cm.ManagedFields[0].Manager != "syncloop@team-b/copy" {
		t.Errorf("team-b's child is managed by %v; want syncloop@team-b/copy alone", cm.ManagedFields)
	}
	cb := b.loop("copy")
	r0 := cb.resyncs.Load()
	b.eventually("two resyncs (and sweeps) of team-b", func() bool { return cb.resyncs.Load() >= r0+2 })
	for name, was := range before {
		cm, ok := a.configMap(a.ns, name)
		if !ok || cm.ResourceVersion != was.ResourceVersion {
			t.Errorf("team-b wrote or deleted the default installation's %s", name)
		}
		if w := b.writesTo("configmaps", b.ns, name); len(w) > 0 {
			t.Errorf("%d writes of team-b reached the default installation's %s: %v", len(w), name, w[0])
		}
	}
	tbCopy, _ := a.configMap(a.ns, "tb-copy")
	if w := a.writesTo("configmaps", a.ns, "tb-copy"); len(w) > 0 {
		t.Errorf("the default installation wrote team-b's child: %v", w[0])
	}

	// The shared trigger goes: its child is the default installation's to
	// delete, and only it deletes it; team-b's child stays as it is.
	if err := a.cs.CoreV1().ConfigMaps(a.ns).Delete(t.Context(), "shared", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.eventually("shared-copy pruned", func() bool { _, ok := a.configMap(a.ns, "shared-copy"); return !ok })
	ca := a.loop("copy")
	r1 := ca.resyncs.Load()
	a.eventually("two resyncs of the default installation", func() bool { return ca.resyncs.Load() >= r1+2 })
	if cm, ok := a.configMap(a.ns, "tb-copy"); !ok || cm.ResourceVersion != tbCopy.ResourceVersion {
		t.Error("the default installation wrote or deleted team-b's child")
	}
	if deletes := b.counter.Requests(func(r testenv.Request) bool { return r.Method == "DELETE" }); len(deletes) > 0 {
		t.Errorf("team-b deleted %v", deletes[0])
	}
}
