package manager

import (
	"fmt"
	"testing"
	"time"

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
	// loaded stamps cr as a version of content first read at minute m.
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	loaded := func(cr appsv1.ControllerRevision, m int) appsv1.ControllerRevision {
		cr.Annotations = withLoadedAt(cr.Annotations, at(m))
		return cr
	}
	cases := []struct {
		name    string
		current []*rules.Rule
		revs    []appsv1.ControllerRevision
		want    bool
		loaded  int // when current's content was first read, in minutes; 0: not known
	}{
		{"its own is the newest", []*rules.Rule{rule("a", "2")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, false, 0},
		{"a newer one recorded", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, true, 0},
		{"its own never recorded: which is newer is not known", []*rules.Rule{rule("a", "3")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, false, 0},
		{"a rule removed from the file since", []*rules.Rule{rule("a", "1"), rule("b", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("b", "1", 1, "")}, true, 0},
		{"a rule added to the file since", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("b", "1", 1, file)}, true, 0},
		{"a rule moved to another file since", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, "/rules/b.yaml")}, true, 0},
		{"two rules, both the newest", []*rules.Rule{rule("a", "1"), rule("b", "4")},
			[]appsv1.ControllerRevision{rev("b", "3", 3, file), rev("a", "1", 1, file), rev("b", "4", 4, file)}, false, 0},
		{"a rolled back: the older version renumbered newest", []*rules.Rule{rule("a", "2")},
			[]appsv1.ControllerRevision{rev("a", "1", 3, file), rev("a", "2", 2, file)}, true, 0},
		// When both were loaded is known, the later is newer, recorded
		// or not: the fault campaign found two replicas that loaded a
		// version, not recorded (the third's recording of the next one
		// failed, and was retried), running it for good.
		{"loaded before the newest recorded, its own never recorded", []*rules.Rule{rule("a", "2")},
			[]appsv1.ControllerRevision{loaded(rev("a", "1", 1, file), 1), loaded(rev("a", "3", 2, file), 3)}, true, 2},
		{"loaded after the newest recorded, its own never recorded", []*rules.Rule{rule("a", "3")},
			[]appsv1.ControllerRevision{loaded(rev("a", "1", 1, file), 1), loaded(rev("a", "2", 2, file), 2)}, false, 3},
		{"loaded before, yet recorded after the newest", []*rules.Rule{rule("a", "2")},
			[]appsv1.ControllerRevision{loaded(rev("a", "3", 1, file), 3), loaded(rev("a", "2", 2, file), 2)}, false, 2},
		{"one load time not recorded: by the record", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{rev("a", "1", 1, file), rev("a", "2", 2, file)}, true, 5},
		{"numbered the same, recorded at once: the later loaded is newest", []*rules.Rule{rule("a", "1")},
			[]appsv1.ControllerRevision{loaded(rev("a", "2", 2, file), 2), loaded(rev("a", "1", 2, file), 1)}, true, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			current := &rules.File{Path: file, Rules: c.current}
			if c.loaded != 0 {
				current.LoadedAt = at(c.loaded)
			}
			if got := supersededBy(current, c.revs, newestMarked(c.revs, file)); got != c.want {
				t.Errorf("superseded %v, want %v", got, c.want)
			}
		})
	}
}
