package engine

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
)

// secret is a Secret ns/name of type Opaque.
func secret(name string) *unstructured.Unstructured {
	s := obj("Secret", name, nil, map[string]string{"k": "dg=="})
	s.Object["type"] = "Opaque"
	return s
}

// decision is one reconcile of trigger "t" decided from caches a test
// sets up: the writes it makes, in order, and whether it fails.
type decision struct {
	name string
	rule string
	// given fills the caches, and may reconcile first (as syncloop would
	// have before); the writes of those reconciles are not checked.
	given   func(u *unit)
	want    []string
	wantErr string // a part of the error; "" none
}

// TestDecisions: what one reconcile writes — create, skip, update, repair,
// prune, release, hold, conflict, adopt, createOnce, teardown — decided
// from the caches alone, each line a write (or a note) the writer was
// asked for.
func TestDecisions(t *testing.T) {
	t.Parallel()
	trigger := func(u *unit, labels, data map[string]string) {
		u.triggers().put(obj("ConfigMap", "t", labels, data))
	}
	copied := func(u *unit) {
		trigger(u, map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
		u.mustReconcile()
	}
	widget := func(u *unit) {
		w := obj("Widget", "t", map[string]string{"waves": ""}, nil)
		w.Object["spec"] = map[string]any{"size": int64(1)}
		u.triggers().put(w)
	}
	deleting := func(u *unit) {
		u.changeTrigger("t", func(t *unstructured.Unstructured) {
			now := metav1.Now()
			t.SetDeletionTimestamp(&now)
		})
	}
	waves := strings.ReplaceAll(wavesRule, "TEARDOWN", "Ordered")
	cases := []decision{
		{name: "creates the children the trigger wants", rule: copyRule,
			given: func(u *unit) { trigger(u, nil, map[string]string{"k": "v", "teams": "a,b"}) },
			want:  []string{"create ConfigMap ns/t-copy", "create ConfigMap ns/t-team-a", "create ConfigMap ns/t-team-b"}},
		{name: "writes nothing at steady state", rule: copyRule, given: copied},
		{name: "updates a child the trigger's change changes", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				u.changeTrigger("t", func(t *unstructured.Unstructured) { t.Object["data"] = map[string]any{"k": "v2"} })
			},
			want: []string{"update ConfigMap ns/t-copy"}},
		{name: "writes nothing while the cache lags its own update", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				old, _, _ := u.children("ConfigMap").idx.GetByKey("ns/t-copy")
				u.changeTrigger("t", func(t *unstructured.Unstructured) { t.Object["data"] = map[string]any{"k": "v2"} })
				u.mustReconcile()
				u.children("ConfigMap").put(old.(*unstructured.Unstructured)) // the update's event has not come
			}},
		{name: "repairs drift in a field it owns", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				u.changeChild("ConfigMap", "t-copy", func(c *unstructured.Unstructured) { c.Object["data"] = map[string]any{"k": "drifted"} })
			},
			want: []string{"update ConfigMap ns/t-copy"}},
		{name: "leaves fields it does not own", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				u.changeChild("ConfigMap", "t-copy", func(c *unstructured.Unstructured) {
					l := c.GetLabels()
					l["added"] = "by-someone"
					c.SetLabels(l)
					unstructured.SetNestedField(c.Object, "x", "data", "extra")
				})
			}},
		{name: "prunes a forEach child no longer wanted", rule: copyRule,
			given: func(u *unit) {
				trigger(u, nil, map[string]string{"k": "v", "teams": "a,b"})
				u.mustReconcile()
				u.changeTrigger("t", func(t *unstructured.Unstructured) { t.Object["data"] = map[string]any{"k": "v", "teams": "a"} })
			},
			want: []string{"update ConfigMap ns/t-copy", "delete ConfigMap ns/t-team-b"}},
		{name: "prunes every child when when is false", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				u.changeTrigger("t", func(t *unstructured.Unstructured) { t.Object["data"] = map[string]any{"skip": "true"} })
			},
			want: []string{"delete ConfigMap ns/t-copy"}},
		{name: "prunes the children of a trigger gone", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				u.triggers().idx.Delete(obj("ConfigMap", "t", nil, nil))
			},
			want: []string{"delete ConfigMap ns/t-copy"}},
		{name: "prunes nothing while the triggers list", rule: copyRule,
			given: func(u *unit) {
				copied(u)
				u.triggers().idx.Delete(obj("ConfigMap", "t", nil, nil))
				u.triggers().unsynced = true
			}},
		{name: "leaves an object that is not syncloop's", rule: copyRule,
			given: func(u *unit) {
				trigger(u, nil, map[string]string{"k": "v"})
				u.serve(obj("ConfigMap", "t-copy", nil, nil))
			},
			want:    []string{`conflict ConfigMap t-copy: exists and is not syncloop's`},
			wantErr: "is not syncloop's"},
		{name: "leaves another rule's child", rule: copyRule,
			given: func(u *unit) {
				trigger(u, nil, map[string]string{"k": "v"})
				u.serve(obj("ConfigMap", "t-copy", map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "other"}, nil))
			},
			want:    []string{`conflict ConfigMap t-copy: is a child of rule "other"`},
			wantErr: `child of rule "other"`},
		{name: "adopts an object annotated for the rule", rule: copyRule,
			given: func(u *unit) {
				trigger(u, nil, map[string]string{"k": "v"})
				o := obj("ConfigMap", "t-copy", nil, nil)
				o.SetAnnotations(map[string]string{rules.AnnotationAdopt: "copy"})
				u.serve(o)
			},
			want: []string{"adopt ConfigMap ns/t-copy"}},
		{name: "makes a createOnce child and remembers it", rule: createOnceRule,
			given: func(u *unit) { trigger(u, map[string]string{"once": ""}, map[string]string{"v": "1"}) },
			want: []string{"create ConfigMap ns/t-once", "create ConfigMap ns/t-kept",
				"mark t finalizers=[] annotations=[" + rules.CreatedOnceKey("once") + "]"}},
		{name: "does not make a createOnce child again", rule: createOnceRule,
			given: func(u *unit) {
				trigger(u, map[string]string{"once": ""}, map[string]string{"v": "1"})
				u.mustReconcile()
				u.children("ConfigMap").idx.Delete(obj("ConfigMap", "t-once", nil, nil))
				u.changeTrigger("t", func(t *unstructured.Unstructured) { t.Object["data"] = map[string]any{"v": "2"} })
			},
			want: []string{"update ConfigMap ns/t-kept"}},
		{name: "holds a trigger whose children go in order", rule: waves, given: widget,
			want: []string{"create ConfigMap ns/t-base", "create ConfigMap ns/t-mid", "create ConfigMap ns/t-top",
				"mark t finalizers=[" + "teardown.syncloop.dev/waves" + "] annotations=[]", "status t Ready=True/AllResourcesReady"}},
		{name: "holds no trigger torn down at once", rule: strings.ReplaceAll(wavesRule, "TEARDOWN", "Unordered"), given: widget,
			want: []string{"create ConfigMap ns/t-base", "create ConfigMap ns/t-mid", "create ConfigMap ns/t-top", "status t Ready=True/AllResourcesReady"}},
		{name: "tears the dependents down first", rule: waves,
			given: func(u *unit) { widget(u); u.mustReconcile(); deleting(u) },
			want: []string{"delete ConfigMap ns/t-top (foreground)", "tearing down t: deleting wave 1 of 3: ConfigMap ns/t-top",
				"status t Ready=False/TearingDown"}},
		{name: "waits for a wave before the next", rule: waves,
			given: func(u *unit) {
				widget(u)
				u.mustReconcile()
				top, _, _ := u.children("ConfigMap").idx.GetByKey("ns/t-top")
				deleting(u)
				u.mustReconcile()
				u.children("ConfigMap").put(top.(*unstructured.Unstructured)) // going, in the foreground
			}},
		{name: "lets the trigger go after the last wave", rule: waves,
			given: func(u *unit) {
				widget(u)
				u.mustReconcile()
				deleting(u)
				for _, c := range []string{"t-top", "t-mid", "t-base"} {
					u.children("ConfigMap").idx.Delete(obj("ConfigMap", c, nil, nil))
				}
			},
			want: []string{"unfinalize t teardown.syncloop.dev/waves"}},
		{name: "makes nothing a lookup it needs lacks", rule: pullRule,
			given: func(u *unit) { trigger(u, map[string]string{"pull": "yes"}, nil) }},
		{name: "makes what a lookup found", rule: pullRule,
			given: func(u *unit) {
				trigger(u, map[string]string{"pull": "yes"}, nil)
				u.lookups("source").put(secret("source"))
			},
			want: []string{"create Secret ns/t-pull"}},
		{name: "prunes what a lookup no longer finds", rule: pullRule,
			given: func(u *unit) {
				trigger(u, map[string]string{"pull": "yes"}, nil)
				u.lookups("source").put(secret("source"))
				u.mustReconcile()
				u.lookups("source").idx.Delete(obj("Secret", "source", nil, nil))
			},
			want: []string{"delete Secret ns/t-pull"}},
		{name: "patches objects it does not own", rule: patchRule,
			given: func(u *unit) {
				trigger(u, map[string]string{"app": "a"}, nil)
				u.patched("target").put(obj("ConfigMap", "target", nil, nil))
				u.patched("namespace").put(obj("Namespace", "ns", nil, nil))
			},
			want: []string{"patch ConfigMap ns/target", "patch Namespace ns"}},
		{name: "waits for an object to patch", rule: patchRule,
			given: func(u *unit) {
				trigger(u, map[string]string{"app": "a"}, nil)
				u.patched("namespace").put(obj("Namespace", "ns", nil, nil))
			},
			want: []string{"patch Namespace ns"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			u := newUnit(t, c.rule)
			c.given(u)
			got, err := u.reconcile("t")
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("reconcile failed: %v", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("reconcile error %v, want one saying %q", err, c.wantErr)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("writes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
			}
		})
	}
}
