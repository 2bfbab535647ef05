package manager

import (
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/syncloop/syncloop/rules"
)

// TestSupersededBy: a broken file's own last good version gives way to
// the revisions' only when they know it and hold a newer one.
func TestSupersededBy(t *testing.T) {
	const file = "/rules/a.yaml"
	rule := func(name, v string) *rules.Rule {
		return &rules.Rule{Name: name, Content: rules.Content{Hash: name + v, Source: []byte(fmt.Sprintf(`{"v":%q}`, v))}}
	}
	// rev is a revision of name at v, number n, marked with marked; its
	// source as the API server returns it (spaced, not canonical).
	rev := func(name, v string, n int64, marked string) appsv1.ControllerRevision {
		return appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Name: name + v,
			Labels:      map[string]string{rules.LabelRule: name},
			Annotations: map[string]string{rules.AnnotationSourceFile: marked, rules.AnnotationRuleHash: "other-hash"}},
			Data: runtime.RawExtension{Raw: fmt.Appendf(nil, `{ "v": %q }`, v)}, Revision: n}
	}
	cases := []struct {
		name    string
		current []*rules.Rule
		revs    []appsv1.ControllerRevision
		want    bool
	}{
		{"its own is the newest", []*rules.Rule{rule("a", "2")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, false},
		{"a newer one recorded", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, true},
		{"its own never recorded: which is newer is not known", []*rules.Rule{rule("a", "3")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, false},
		{"a rule removed from the file since", []*rules.Rule{rule("a", "1"), rule("b", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("b", "1", 1, "")}, true},
		{"a rule added to the file since", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("b", "1", 1, file)}, true},
		{"a rule moved to another file since", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, "/rules/b.yaml")}, true},
		{"two rules, both the newest", []*rules.Rule{rule("a", "1"), rule("b", "4")},
			[]appsv1.ControllerRevision{rev("b", "3", 3, file), rev("a", "1", 1, file), rev("b", "4", 4, file)}, false},
		{"a rolled back: the older version renumbered newest", []*rules.Rule{rule("a", "2")},
			[]appsv1.ControllerRevision{rev("a", "1", 3, file), rev("a", "2", 2, file)}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			current := &rules.File{Path: file, Rules: c.current}
			if got := supersededBy(current, c.revs, newestMarked(c.revs, file)); got != c.want {
				t.Errorf("superseded %v, want %v", got, c.want)
			}
		})
	}
}
