package render

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// twoFunctions is a rule with two resources whose children webhooks
// compute, answered offline by a test's recorded responses.
const twoFunctions = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: hello}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  resources:
    - id: a
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      function: {webhook: {url: 'http://127.0.0.1:1/a'}}
    - id: b
      kinds: [{apiVersion: v1, kind: ConfigMap}]
      function: {webhook: {url: 'http://127.0.0.1:1/b'}}
`

// answered renders r for the trigger App web offline, its webhooks
// answered by answers (by resource, as a test records them), and returns
// how many bytes it allocated and the render's error.
func answered(t *testing.T, r *rules.Rule, answers map[string][]byte) (uint64, error) {
	t.Helper()
	rec := Recorded{}
	for id, a := range answers {
		rec.Responses = append(rec.Responses, RecordedResponse{Rule: r.Name, Resource: id, Trigger: rules.ObjectRef{Kind: "App", Name: "web"}, Response: a})
	}
	trigger := obj("example.com/v1", "App", "ns", "web", nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: rec, Clusters: rec, Recorded: rec})
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, err
}

// repeated is head, then n copies of elem joined by commas, then tail.
func repeated(head, elem string, n int, tail string) []byte {
	return []byte(head + strings.Repeat(elem+",", n-1) + elem + tail)
}

// TestHostileAnswerRefusedBeforeDecode: an answer that would decode into
// more values than the trigger's render budget holds is refused before
// it is decoded — whichever function returns it (a resource's, the
// rule's sync or customize hook), wherever it puts them (children,
// status) and however it shapes them (lists, objects, keys, nesting) —
// with an error wrapping expr.ErrTooLarge that names the function, while
// allocating a small part of what decoding it would (16 MiB of [[],…]
// took some 360 MB to decode).
func TestHostileAnswerRefusedBeforeDecode(t *testing.T) {
	const size = 16 << 20 // a call's output limit (function.DefaultLimits)
	keys := func() []byte {
		var b strings.Builder
		b.WriteString(`{"status": {`)
		for i := 0; b.Len() < size-16; i++ {
			fmt.Fprintf(&b, `"%x":0,`, i)
		}
		b.WriteString(`"z":0}}`)
		return []byte(b.String())
	}
	sync := syncRule(t, "http://127.0.0.1:1")
	for _, c := range []struct {
		name   string
		r      *rules.Rule
		id     string // the resource answered
		answer []byte
		fn     string // how the error names the function
		want   string
	}{
		{"lists of a resource's children", parseRule(t, twoFunctions), "a", repeated(`{"children": [`, "[]", size/3-6, "]}"), "webhook http://127.0.0.1:1/a", "MiB"},
		{"objects in a sync hook's status", sync, rules.SyncResourceID, repeated(`{"status": {"x": [`, "{}", size/3-8, "]}}"), "webhook http://127.0.0.1:1", "MiB"},
		{"keys in a sync hook's status", sync, rules.SyncResourceID, keys(), "webhook http://127.0.0.1:1", "MiB"},
		{"small values in a sync hook's children", sync, rules.SyncResourceID, repeated(`{"children": [{"x": [`, "0", size/2-12, "]}]}"), "webhook http://127.0.0.1:1", "MiB"},
		{"lists in a customize hook's answer", customizeRule(t, "http://127.0.0.1:1"), rules.SyncResourceID + "/customize",
			repeated(`{"relatedResources": [`, "[]", size/3-10, "]}"), "customize webhook http://127.0.0.1:1/customize", "MiB"},
		{"nesting", parseRule(t, twoFunctions), "a", []byte(`{"children": [` + strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20) + "]}"),
			"webhook http://127.0.0.1:1/a", "nested more than 100 levels deep"},
	} {
		t.Run(c.name, func(t *testing.T) {
			allocated, err := answered(t, c.r, map[string][]byte{c.id: c.answer})
			if !errors.Is(err, expr.ErrTooLarge) || !strings.Contains(err.Error(), c.fn+": its answer") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want the answer of %s refused as too large (%s)", err, c.fn, c.want)
			}
			if allocated > 8<<20 {
				t.Errorf("refusing a %d-byte answer allocated %d MiB: it was decoded", len(c.answer), allocated>>20)
			}
		})
	}
}

// TestAnswersShareTheBudget: what functions answer is charged to the
// same budget as the rest of the render: two answers that each fit alone
// do not both fit one trigger.
func TestAnswersShareTheBudget(t *testing.T) {
	r := parseRule(t, twoFunctions)
	// One child holding n small values: about 66 bytes charged each
	// (twice a boxed value and a list element, and its two bytes).
	const n = 1_200_000 // 76 MiB charged: more than half the budget
	answer := func(name string) []byte {
		return repeated(`{"children": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "`+name+`"}, "x": [`, "0", n, "]}]}")
	}
	if _, err := answered(t, r, map[string][]byte{"a": answer("a")}); errors.Is(err, expr.ErrTooLarge) || !strings.Contains(err.Error(), "/b: a webhook is called only where the cluster is") {
		t.Fatalf("one answer alone: %v, want it within the budget (and b unanswered offline)", err)
	}
	_, err := answered(t, r, map[string][]byte{"a": answer("a"), "b": answer("b")})
	if !errors.Is(err, expr.ErrTooLarge) || !strings.Contains(err.Error(), "webhook http://127.0.0.1:1/b: its answer") {
		t.Fatalf("two answers: %v, want the second refused as too large", err)
	}
}

// TestResyncAfterFloor: a sync hook cannot have its trigger queued again
// sooner than MinResyncAfter, however small a wait it asks for; 0 is
// not again.
func TestResyncAfterFloor(t *testing.T) {
	r := syncRule(t, "http://127.0.0.1:1")
	for asked, want := range map[string]time.Duration{
		"1e-9": time.Second, "0.000001": time.Second, "0.5": time.Second, "5e-324": time.Second,
		"0": 0, "1.5": 1500 * time.Millisecond, "86400": 24 * time.Hour,
	} {
		rec := Recorded{Responses: []RecordedResponse{{Rule: r.Name, Resource: rules.SyncResourceID, Trigger: rules.ObjectRef{Kind: "App", Name: "web"},
			Response: []byte(`{"resyncAfterSeconds": ` + asked + `}`)}}}
		rd, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "ns", "web", nil), Scoper: testScopes, Lookups: rec, Clusters: rec, Recorded: rec})
		if err != nil {
			t.Fatalf("%s: %v", asked, err)
		}
		if rd.ResyncAfter != want {
			t.Errorf("resyncAfterSeconds %s: again after %s, want %s", asked, rd.ResyncAfter, want)
		}
	}
}

// shapeOf is what v, decoded JSON, holds.
func shapeOf(v any, s *expr.Shape) {
	s.Values++
	switch v := v.(type) {
	case map[string]any:
		s.Maps++
		for k, e := range v {
			s.Entries++
			s.Bytes += int64(len(k))
			shapeOf(e, s)
		}
	case []any:
		s.Lists++
		for _, e := range v {
			s.Elems++
			shapeOf(e, s)
		}
	case string:
		s.Bytes += int64(len(v))
	}
}

// atLeast reports whether measured counts at least what got holds.
func atLeast(measured, got expr.Shape) bool {
	return measured.Values >= got.Values && measured.Maps >= got.Maps && measured.Entries >= got.Entries &&
		measured.Lists >= got.Lists && measured.Elems >= got.Elems && measured.Bytes >= got.Bytes
}

// TestMeasureJSON: what the measure counts is at least what decoding
// makes — strings with escapes, quotes and brackets inside, invalid
// UTF-8 (decoded as U+FFFD, three bytes), keys named twice — and exactly
// it for plain JSON; nesting is refused past MaxOutputDepth, not at it.
func TestMeasureJSON(t *testing.T) {
	for _, in := range []string{
		`{"children": [{"a": 1, "b": [true, null, -1.5e3], "c": {"d": "e"}}]}`,
		`{"a": "]}[{,:\"\\", "b": ["\u00e9\ud83d\ude00", "x\"y"], "c": []}`,
		"{\"a\": \"\xff\xfe\x80\", \"b\": [\"\xc3\"]}",
		`{"a": 1, "a": 2, "a": {"b": [1, 2]}}`,
		` { "a" : [ 1 , { } , [ ] ] } `,
		`"top"`, `12`, `null`, `[]`,
	} {
		var v any
		if err := utiljson.Unmarshal([]byte(in), &v); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		var got expr.Shape
		shapeOf(v, &got)
		measured, err := measureJSON([]byte(in))
		if err != nil || !atLeast(measured, got) {
			t.Errorf("%s: measured %v (%v), decoded %v", in, measured, err, got)
		}
	}
	plain := `{"children": [{"a": 1, "b": [true, null, "xy"]}]}`
	if m, _ := measureJSON([]byte(plain)); m != (expr.Shape{Values: 8, Maps: 2, Entries: 3, Lists: 2, Elems: 4, Bytes: 12}) {
		t.Errorf("%s: measured %+v", plain, m)
	}
	deep := func(n int) []byte { return []byte(strings.Repeat("[", n) + strings.Repeat("]", n)) }
	if _, err := measureJSON(deep(MaxOutputDepth)); err != nil {
		t.Errorf("%d levels: %v", MaxOutputDepth, err)
	}
	for _, in := range [][]byte{deep(MaxOutputDepth + 1), []byte(strings.Repeat(`{"a":`, MaxOutputDepth+1))} {
		if _, err := measureJSON(in); !errors.Is(err, expr.ErrTooLarge) {
			t.Errorf("%.20s… (%d levels): %v, want refused", in, MaxOutputDepth+1, err)
		}
	}
}
