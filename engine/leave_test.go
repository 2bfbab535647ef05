package engine

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
)

// TestLeaveDecision: the children leaving a cluster go only when every
// trigger with children there has told its selection and, all together,
// they are within maxPrunes of the rule's children there.
func TestLeaveDecision(t *testing.T) {
	child := func(owner, id string) object {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("ConfigMap")
		u.SetName(owner + "-" + id)
		u.SetAnnotations(map[string]string{rules.AnnotationOwner: "v1/ConfigMap/ns/" + owner, rules.AnnotationResourceID: id})
		return u
	}
	var children []object
	for i := range 10 {
		children = append(children, child(fmt.Sprintf("t%d", i), "copy"))
	}
	children = append(children, child("t0", "other"))
	told := func(leavers ...int) map[string]map[string]bool {
		left := map[string]map[string]bool{}
		for i := range 10 {
			left["v1/ConfigMap/ns/"+fmt.Sprintf("t%d", i)] = map[string]bool{}
		}
		for _, i := range leavers {
			left[fmt.Sprintf("v1/ConfigMap/ns/t%d", i)]["copy"] = true
		}
		return left
	}
	all := func(string) bool { return true }
	tenPercent := rules.Amount{Value: 10, Percent: true}
	for _, c := range []struct {
		name    string
		left    map[string]map[string]bool
		exists  func(string) bool
		budget  rules.Amount
		deleted int
		going   int
		ok      bool
		held    bool
		why     string
	}{
		{"one trigger moves", told(3), all, tenPercent, 0, 1, true, false, ""},
		{"two of 11 are 10%, rounded up", told(3, 4), all, tenPercent, 0, 2, true, false, ""},
		{"three of 11 are more", told(3, 4, 5), all, tenPercent, 0, 3, false, true, "3 of the rule's 11 children there are leaving (0 gone already), more than rollout.maxPrunes (10%, 2) allows: none is deleted"},
		{"what went since none was left counts", told(3), all, tenPercent, 2, 1, false, true, "3 of the rule's 13 children there are leaving (2 gone already), more than rollout.maxPrunes (10%, 2)"},
		{"every trigger leaves (a relabel)", told(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), all, tenPercent, 0, 10, false, true, "10 of the rule's 11 children there are leaving"},
		{"raised to 100%", told(0, 1, 2, 3, 4, 5, 6, 7, 8, 9), all, rules.Amount{Value: 100, Percent: true}, 0, 10, true, false, ""},
		{"a number", told(3, 4), all, rules.Amount{Value: 2}, 0, 2, true, false, ""},
		{"nothing leaves", told(), all, rules.Amount{}, 0, 0, true, false, ""},
		{"a trigger yet to tell", func() map[string]map[string]bool { l := told(3); delete(l, "v1/ConfigMap/ns/t7"); return l }(), all, tenPercent, 0, 1, false, false,
			"1 more triggers with children there are to be reconciled first (v1/ConfigMap/ns/t7)"},
		{"a trigger that is gone tells nothing", func() map[string]map[string]bool { l := told(3); delete(l, "v1/ConfigMap/ns/t7"); return l }(),
			func(o string) bool { return !strings.HasSuffix(o, "/t7") }, tenPercent, 0, 1, true, false, ""},
	} {
		going, ok, held, why := leaveDecision(children, c.left, c.exists, c.budget, c.deleted)
		if len(going) != c.going || ok != c.ok || held != c.held || !strings.Contains(why, c.why) || (ok && why != "") {
			t.Errorf("%s: going %d, ok %v, held %v, why %q; want %d, %v, %v, %q", c.name, len(going), ok, held, why, c.going, c.ok, c.held, c.why)
		}
	}
}

// TestLeavesTell: a resource that waits keeps what was known of it; the
// others say what they are now; a trigger that wants nothing is
// forgotten; a sweep is wanted while any trigger's children leave.
func TestLeavesTell(t *testing.T) {
	lv := newLeaves()
	if !lv.tell("o", map[string]bool{"a": true, "b": true}, nil) {
		t.Error("children leaving, and no sweep wanted")
	}
	lv.tell("o", map[string]bool{}, map[string]bool{"b": true})
	if got := lv.left["o"]; got["a"] || !got["b"] {
		t.Errorf("left %v, want b only: a came back into the selection, b waits", got)
	}
	if lv.tell("p", nil, nil); lv.leaving != 1 {
		t.Errorf("%d triggers leaving, want 1 (o)", lv.leaving)
	}
	if lv.tell("o", nil, nil) {
		t.Error("nothing leaves, and a sweep is wanted")
	}
	lv.tell("o", map[string]bool{"a": true}, nil)
	lv.forget("o")
	if _, ok := lv.left["o"]; ok || lv.leaving != 0 {
		t.Errorf("a forgotten trigger is still known (leaving %d)", lv.leaving)
	}
}
