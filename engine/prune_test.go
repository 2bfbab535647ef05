package engine

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// TestPruneProperty: over random children — any mix of syncloop's labels
// and owner annotation present, absent or naming someone else, desired or
// not, the trigger present or gone — prune deletes exactly the children
// that carry the managed-by label, this rule's label, a trigger UID label
// and this trigger's owner annotation and are not desired, each with its
// own UID as the delete's precondition — whether the cache holds them
// unstructured or typed. The fake client only records the
// requests: what the API server does with them is the integration tests'
// business.
func TestPruneProperty(t *testing.T) {
	const rule, owner = "copy", "v1/ConfigMap/ns/trigger"
	gvk := schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	mapping := &meta.RESTMapping{Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, GroupVersionKind: gvk, Scope: meta.RESTScopeNamespace}
	pick := func(r *rand.Rand, choices ...string) string { return choices[r.IntN(len(choices))] }

	for seed := range uint64(300) {
		r := rand.New(rand.NewPCG(seed, 7))
		var existing []object
		var objs []runtime.Object
		for i := range 1 + r.IntN(12) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			u.SetNamespace("ns")
			u.SetName(fmt.Sprintf("c-%d", i))
			u.SetUID(types.UID(pick(r, "", fmt.Sprintf("uid-%d", i), fmt.Sprintf("uid-%d", i))))
			labels := map[string]string{}
			for key, values := range map[string][]string{
				rules.LabelManagedBy: {"", rules.ManagedByValue, rules.ManagedByValue, "helm"},
				rules.LabelRule:      {"", rule, rule, "other"},
				rules.LabelOwnerUID:  {"", "trigger-uid", "trigger-uid", "older-uid"},
			} {
				if v := pick(r, values...); v != "" {
					labels[key] = v
				}
			}
			u.SetLabels(labels)
			if a := pick(r, "", owner, owner, "v1/ConfigMap/ns/another"); a != "" {
				u.SetAnnotations(map[string]string{rules.AnnotationOwner: a})
			}
			objs = append(objs, u.DeepCopy())
			if seed%2 == 1 { // as the caches hold ConfigMaps: typed
				cm := &corev1.ConfigMap{}
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cm); err != nil {
					t.Fatal(err)
				}
				existing = append(existing, cm)
				continue
			}
			existing = append(existing, u)
		}
		var desired map[childRef]bool // nil: the trigger is gone
		if r.IntN(4) > 0 {
			desired = map[childRef]bool{}
			for _, u := range existing {
				if r.IntN(2) == 0 {
					desired[refOf(u)] = true
				}
			}
		}

		client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), objs...)
		// The reconciler needs no informer: the children are given.
		w := &watches{children: map[schema.GroupVersionKind]*childKind{gvk: {mapping: mapping}}}
		rc := newReconciler(&rules.Rule{Name: rule}, w, staticMapper{}, nil, noMetrics{}, DefaultFightPolicy, func(writes *ownWrites) writer {
			return &liveWriter{rule: rule, client: &dynamic.Writer{Client: &dynamic.Client{Dynamic: client}}, writes: writes, metrics: noMetrics{}}
		})
		if err := rc.prune(t.Context(), &changes{}, rules.ObjectRef{}, owner, existing, desired, nil); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}

		deleted := map[string]*metav1.DeleteOptions{}
		for _, a := range client.Actions() {
			if d, ok := a.(k8stesting.DeleteActionImpl); ok {
				deleted[d.Name] = &d.DeleteOptions
			}
		}
		for _, u := range existing {
			l := u.GetLabels()
			ownsIt := u.GetUID() != "" && l[rules.LabelManagedBy] == rules.ManagedByValue && l[rules.LabelRule] == rule &&
				l[rules.LabelOwnerUID] != "" && u.GetAnnotations()[rules.AnnotationOwner] == owner
			want := ownsIt && !desired[refOf(u)]
			opts, got := deleted[u.GetName()]
			switch {
			case got && !want:
				t.Fatalf("seed %d: deleted %s with labels %v, annotations %v, desired %v", seed, u.GetName(), l, u.GetAnnotations(), desired[refOf(u)])
			case want && !got:
				t.Fatalf("seed %d: did not prune %s, an undesired child of this trigger", seed, u.GetName())
			case got && (opts.Preconditions == nil || opts.Preconditions.UID == nil || *opts.Preconditions.UID != u.GetUID()):
				t.Fatalf("seed %d: deleted %s without its UID %q as precondition: %+v", seed, u.GetName(), u.GetUID(), opts.Preconditions)
			}
		}
	}
}

// TestPruneLeavesLookAlikes: when a trigger goes, the API server sees one
// DELETE per child, each with the child's UID as precondition, and objects
// that merely look like its children — no trigger UID label, another
// rule's label, no managed-by label, no owner annotation, or one naming a
// trigger of a kind the rule does not watch — stay.
//
// API server: DELETE with a UID precondition (409 on a look-alike).
func TestPruneLeavesLookAlikes(t *testing.T) {
	h := newHarness(t)
	trig := h.createCM("t", map[string]string{"copy": "yes"}, map[string]string{"teams": "a,b"})
	owner := "v1/ConfigMap/" + h.ns + "/t"
	h.createCM("other-trigger", map[string]string{"copy": "yes"}, nil)
	uid := string(trig.UID)
	all := func(drop string, set map[string]string) map[string]string {
		l := map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "copy", rules.LabelOwnerUID: uid}
		delete(l, drop)
		for k, v := range set {
			l[k] = v
		}
		return l
	}
	lookAlikes := map[string]map[string]string{
		"no-owner-uid":  all(rules.LabelOwnerUID, nil),
		"other-rule":    all("", map[string]string{rules.LabelRule: "other"}),
		"no-managed-by": all(rules.LabelManagedBy, nil),
		"no-annotation": all("", nil),
		"other-kind":    all("", nil),
	}
	for name, labels := range lookAlikes {
		ann := map[string]string{rules.AnnotationOwner: owner}
		switch name {
		case "no-annotation":
			ann = nil
		case "other-kind":
			ann[rules.AnnotationOwner] = "v1/Secret/" + h.ns + "/t"
		}
		if _, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: name, Labels: labels, Annotations: ann,
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.start(h.loadRules(copyRule))
	children := []string{"t-copy", "t-team-a", "t-team-b"}
	uids := map[string]types.UID{}
	h.eventually("the children", func() bool {
		for _, name := range children {
			cm, ok := h.configMap(h.ns, name)
			if !ok {
				return false
			}
			uids[name] = cm.UID
		}
		return true
	})
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), "t", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the children to be pruned", func() bool {
		for _, name := range children {
			if _, ok := h.configMap(h.ns, name); ok {
				return false
			}
		}
		return true
	})
	c := h.loop("copy")
	h.eventually("two resyncs and sweeps", func() bool { n := c.resyncs.Load(); return n >= 2 && c.idle() })
	for name := range lookAlikes {
		if _, ok := h.configMap(h.ns, name); !ok {
			t.Errorf("look-alike %s was deleted", name)
		}
	}
	// At most one DELETE per child: a reconcile before the cache has seen a
	// delete does not repeat it. (The garbage collector may delete one
	// first: the children in the trigger's namespace have its
	// ownerReference.)
	deletes := h.counter.Requests(func(r testenv.Request) bool { return r.Method == "DELETE" })
	perChild := map[string]int{}
	for _, d := range deletes {
		perChild[d.Path[strings.LastIndex(d.Path, "/")+1:]]++
	}
	for name, n := range perChild {
		if n > 1 || uids[name] == "" {
			t.Errorf("%d DELETE requests for %s; want at most one, of a child", n, name)
		}
	}
	for _, d := range deletes {
		name := d.Path[strings.LastIndex(d.Path, "/")+1:]
		want := fmt.Sprintf(`"preconditions":{"uid":%q}`, uids[name])
		if uids[name] == "" || !strings.Contains(d.Body, want) {
			t.Errorf("DELETE %s without the UID precondition %s: %s", d.Path, want, d.Body)
		}
	}
}

// TestEmptyRuleSetPrunesNothing: a rule set that suddenly has no rules (every
// file broken, the directory gone — reload keeps the last good rules, but
// the engine must be safe on its own) stops the controllers and deletes
// nothing.
//
// API server: live children that must survive.
func TestEmptyRuleSetPrunesNothing(t *testing.T) {
	h := newHarness(t)
	h.createCM("t", map[string]string{"copy": "yes"}, map[string]string{"teams": "a"})
	h.start(h.loadRules(copyRule))
	h.eventually("the children", func() bool {
		_, a := h.configMap(h.ns, "t-copy")
		_, b := h.configMap(h.ns, "t-team-a")
		return a && b
	})
	empty, err := rules.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	h.updates <- empty
	h.eventually("every loop to stop", func() bool { return len(h.engine.States()) == 0 })
	h.updates <- nil // a nil set, too, is no rules
	h.eventually("every informer to stop", func() bool { return h.engine.Informers() == 0 })
	if deletes := h.counter.Requests(func(r testenv.Request) bool { return r.Method == "DELETE" }); len(deletes) != 0 {
		t.Errorf("%d DELETE requests after the rules went away", len(deletes))
	}
	for _, name := range []string{"t-copy", "t-team-a"} {
		if _, ok := h.configMap(h.ns, name); !ok {
			t.Errorf("%s is gone", name)
		}
	}
}
