package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// TestUnifiedDiff compares with GNU diff -u's output for the same inputs.
func TestUnifiedDiff(t *testing.T) {
	a := "a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: 6\ng: 7\nh: 8\ni: 9\nj: 10\n"
	b := "a: 1\nb: 2\nc: 3\nd: 40\ne: 5\nf: 6\ng: 7\nh: 8\ni: 9\nj: 10\nk: 11\n"
	// Six unchanged lines between the changes: one hunk.
	merged := `--- live
+++ desired
@@ -1,10 +1,11 @@
 a: 1
 b: 2
 c: 3
-d: 4
+d: 40
 e: 5
 f: 6
 g: 7
 h: 8
 i: 9
 j: 10
+k: 11
`
	if got := unifiedDiff(a, b); got != merged {
		t.Errorf("diff:\n%s\nwant:\n%s", got, merged)
	}
	// Eight: two hunks.
	c := "a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: 6\ng: 7\nh: 8\ni: 9\nj: 10\nk: 12\nl: 13\n"
	d := "a: 1\nb: 2\nc: 3\nd: 40\ne: 5\nf: 6\ng: 7\nh: 8\ni: 9\nj: 10\nk: 12\nl: 13\nm: 14\n"
	split := `--- live
+++ desired
@@ -1,7 +1,7 @@
 a: 1
 b: 2
 c: 3
-d: 4
+d: 40
 e: 5
 f: 6
 g: 7
@@ -10,3 +10,4 @@
 j: 10
 k: 12
 l: 13
+m: 14
`
	if got := unifiedDiff(c, d); got != split {
		t.Errorf("diff:\n%s\nwant:\n%s", got, split)
	}
	if got := unifiedDiff(a, a); got != "" {
		t.Errorf("diff of equal texts = %q", got)
	}
	if got := unifiedDiff("", "x: 1\n"); got != "--- live\n+++ desired\n@@ -0,0 +1 @@\n+x: 1\n" { // as GNU diff: an empty side names the line before, one line needs no length
		t.Errorf("diff from nothing = %q", got)
	}
}

func TestDiffObjectsManagedFieldsOnly(t *testing.T) {
	desired := map[string]any{
		"metadata": map[string]any{"name": "x", "annotations": map[string]any{rules.AnnotationAppliedHash: "new", "keep": "v"}},
		"data":     map[string]any{"k": "new"},
	}
	live := map[string]any{
		"metadata": map[string]any{"name": "x", "resourceVersion": "7", "annotations": map[string]any{rules.AnnotationAppliedHash: "old", "keep": "v", "theirs": "z"}},
		"data":     map[string]any{"k": "old", "other": "unmanaged"},
	}
	d := diffObjects("ConfigMap.", live, desired, desired)
	if !strings.Contains(d, "-  k: old\n+  k: new\n") {
		t.Errorf("diff lacks the changed field:\n%s", d)
	}
	for _, unwanted := range []string{"resourceVersion", "theirs", "unmanaged", "applied-hash"} {
		if strings.Contains(d, unwanted) {
			t.Errorf("diff shows %q, which syncloop does not manage or is noise:\n%s", unwanted, d)
		}
	}
}

func TestRedactSecrets(t *testing.T) {
	live := map[string]any{"kind": "Secret", "data": map[string]any{"password": "c2VjcmV0MQ=="}, "stringData": map[string]any{"token": "hunter2"}}
	desired := map[string]any{"kind": "Secret", "data": map[string]any{"password": "c2VjcmV0Mg=="}, "stringData": map[string]any{"token": "hunter3"}}
	d := diffObjects("Secret.", live, desired, desired)
	for _, secret := range []string{"c2VjcmV0MQ==", "c2VjcmV0Mg==", "hunter2", "hunter3"} {
		if strings.Contains(d, secret) {
			t.Fatalf("diff shows a Secret value %q:\n%s", secret, d)
		}
	}
	if !strings.Contains(d, "-  password: (redacted, sha256:") || !strings.Contains(d, "+  password: (redacted, sha256:") {
		t.Errorf("a changed Secret value is not visible as a changed hash:\n%s", d)
	}
	if Redact("ConfigMap.", live)["data"].(map[string]any)["password"] != "c2VjcmV0MQ==" {
		t.Error("Redact changed a ConfigMap")
	}
	if live["data"].(map[string]any)["password"] != "c2VjcmV0MQ==" {
		t.Error("Redact modified its input")
	}
}

func TestPlanPrinter(t *testing.T) {
	trig := rules.ObjectRef{APIVersion: "v1", Kind: "Namespace", Name: "team-a"}
	actions := []Action{
		{Action: ActionCreate, Rule: "tenant", Trigger: trig, Object: rules.ObjectRef{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy", Namespace: "team-a", Name: "default-deny"}},
		{Action: ActionUpdate, Rule: "tenant", Trigger: trig, Object: rules.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Namespace: "team-a", Name: "settings"}, Diff: "--- live\n+++ desired\n@@ -1,1 +1,1 @@\n-a: 1\n+a: 2\n"},
		{Action: ActionDelete, Rule: "tenant", Trigger: trig, Object: rules.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Namespace: "team-a", Name: "team-old"}},
		{Action: ActionStatus, Rule: "app-status", Trigger: rules.ObjectRef{APIVersion: "example.com/v1", Kind: "App", Namespace: "shop", Name: "web"}, Object: rules.ObjectRef{APIVersion: "example.com/v1", Kind: "App", Namespace: "shop", Name: "web"}},
		{Action: ActionWait, Rule: "tenant", Trigger: trig, Resource: "app", Object: rules.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Namespace: "team-a", Name: "app"}, Reason: `waiting for resource "gate"`},
	}
	var text bytes.Buffer
	p := NewPlanPrinter(&text, io.Discard, false, false)
	for i := len(actions) - 1; i >= 0; i-- { // held and sorted: order of arrival does not matter
		p.Plan(actions[i])
	}
	p.Plan(actions[2]) // a trigger planned twice in one pass: its writes are listed once
	p.Failed("tenant", "team-b", errors.New("boom"))
	p.Failed("tenant", "team-b", errors.New("boom"))
	if n, errs := p.Summary(); n != 5 || errs != 1 {
		t.Errorf("Summary = %d actions, %d failures", n, errs)
	}
	want := `~ status  example.com/v1 App shop/web  (rule app-status)
+ create  networking.k8s.io/v1 NetworkPolicy team-a/default-deny  (rule tenant, trigger v1 Namespace team-a)
= wait    resource app (v1 ConfigMap team-a/app)  (rule tenant, trigger v1 Namespace team-a)
    waiting for resource "gate"
~ update  v1 ConfigMap team-a/settings  (rule tenant, trigger v1 Namespace team-a)
    --- live
    +++ desired
    @@ -1,1 +1,1 @@
    -a: 1
    +a: 2
- delete  v1 ConfigMap team-a/team-old  (rule tenant, trigger v1 Namespace team-a)
Plan: 1 to create, 1 to update, 1 to delete, 1 status update, 1 waiting.
`
	if text.String() != want {
		t.Errorf("text plan:\n%s\nwant:\n%s", text.String(), want)
	}

	var js bytes.Buffer
	p = NewPlanPrinter(&js, io.Discard, true, false)
	for _, a := range actions {
		p.Plan(a)
	}
	p.Summary()
	lines := strings.Split(strings.TrimSpace(js.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("JSON plan has %d lines, want 5 (no summary):\n%s", len(lines), js.String())
	}
	if !strings.Contains(js.String(), `{"action":"wait","rule":"tenant","trigger":{"apiVersion":"v1","kind":"Namespace","namespace":"","name":"team-a"},"object":{"apiVersion":"v1","kind":"ConfigMap","namespace":"team-a","name":"app"},"resource":"app","reason":"waiting for resource \"gate\""}`) {
		t.Errorf("JSON plan lacks the wait:\n%s", js.String())
	}
	var first map[string]any
	for _, l := range lines {
		if strings.Contains(l, `"action":"update"`) {
			if err := json.Unmarshal([]byte(l), &first); err != nil {
				t.Fatal(err)
			}
		}
	}
	if first["action"] != "update" || first["rule"] != "tenant" || first["diff"] == "" ||
		first["trigger"].(map[string]any)["kind"] != "Namespace" || first["object"].(map[string]any)["name"] != "settings" {
		t.Errorf("JSON action = %v", first)
	}

	var dd bytes.Buffer
	p = NewPlanPrinter(&dd, io.Discard, false, true)
	p.Plan(actions[1])
	p.Plan(actions[1])
	if strings.Count(dd.String(), "~ update") != 1 {
		t.Errorf("dedup printed a repeated action twice:\n%s", dd.String())
	}
}

// recordingPlanner collects actions, for tests.
type recordingPlanner struct {
	mu      sync.Mutex
	actions []Action
}

func (p *recordingPlanner) Plan(a Action) {
	p.mu.Lock()
	p.actions = append(p.actions, a)
	p.mu.Unlock()
}
func (p *recordingPlanner) Failed(string, string, error)   {}
func (p *recordingPlanner) Rollout(string, string, string) {}
func (p *recordingPlanner) count(action string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.actions {
		if a.Action == action {
			n++
		}
	}
	return n
}

// TestDryRunPersistsNothing: a running dry run plans creates for every
// child, and every write request it sends is a server-side dry run; no
// child, no status and no Event is persisted.
//
// API server: server-side dry-run requests (dryRun=All), persisting
// nothing.
func TestDryRunPersistsNothing(t *testing.T) {
	h := newHarness(t)
	planner := &recordingPlanner{}
	h.plan = planner
	h.createCM("src", map[string]string{"copy": "yes"}, map[string]string{"k": "v", "teams": "a,b"})
	h.start(h.loadRules(copyRule))
	h.eventually("three planned creates", func() bool { return planner.count(ActionCreate) == 3 })
	writes := h.counter.Requests(func(r testenv.Request) bool { return r.IsWrite() })
	if len(writes) == 0 {
		t.Fatal("no write requests at all: the plan was not computed by the server")
	}
	for _, r := range writes {
		if !r.DryRun() {
			t.Errorf("a dry run sent a real write: %s %s?%s", r.Method, r.Path, r.Query)
		}
	}
	if _, ok := h.configMap(h.ns, "src-copy"); ok {
		t.Error("a dry run created a child")
	}
	if n := len(h.events("Applied")) + len(h.events("Failed")); n != 0 {
		t.Errorf("a dry run emitted %d Events", n)
	}
}

// rawControl matches what a terminal acts on or that reorders text, bar
// the newline between lines: C0 and C1 controls, DEL, bidirectional
// overrides and isolates.
var rawControl = regexp.MustCompile("[\x00-\x09\x0b-\x1f\x7f\u0080-\u009f\u202a-\u202e\u2066-\u2069]")

// TestPlanPrinterHostile: an action whose every string — rule, trigger
// and object names, cluster, resource, reason, diff — holds escape
// sequences, returns, forged lines and bidi overrides prints in the text
// plan escaped, each value on its line under its head; its failures and
// rollout transitions too. The JSON plan holds every value exactly.
func TestPlanPrinterHostile(t *testing.T) {
	const hostile = "h\x1b[2J\x1b]0;pwned\x07\r\nPlan: 0 to create, 0 to update\u202e\u2066\u009b\x7f"
	ref := rules.ObjectRef{APIVersion: hostile, Kind: hostile, Namespace: hostile, Name: hostile}
	a := Action{Action: ActionWait, Rule: hostile, Trigger: ref, Object: ref, Cluster: hostile, Diff: "--- live\n+++ desired\n-a: " + hostile + "\n",
		Resource: hostile, Reason: hostile}
	var text, errs bytes.Buffer
	p := NewPlanPrinter(&text, &errs, false, true)
	p.Plan(a)
	p.Rollout(hostile, hostile, hostile)
	p.Failed(hostile, hostile, errors.New(hostile))
	for what, out := range map[string]string{"plan": text.String(), "its errors": errs.String()} {
		if m := rawControl.FindString(out); m != "" {
			t.Errorf("the %s print %q raw:\n%s", what, m, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "Plan:") {
				t.Errorf("a value forged a line of the %s: %q", what, l)
			}
		}
	}
	if !strings.Contains(text.String(), `h\x1b[2J`) {
		t.Errorf("the values are not shown escaped:\n%s", text.String())
	}

	var js bytes.Buffer
	p = NewPlanPrinter(&js, io.Discard, true, true)
	p.Plan(a)
	var back Action
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back != a {
		t.Errorf("the JSON plan does not hold the action exactly (%v):\n%s", err, js.String())
	}
}

// TestDiffHostileValues: a value that sigs.k8s.io/yaml refuses (DEL, a
// C1 control) or changes (NEL), in a field the rule manages, neither
// hides the change of another field from the diff nor changes itself: a
// field whose only change is such a rune is shown changing.
func TestDiffHostileValues(t *testing.T) {
	for _, r := range []string{"\x7f", "\u009b", "\u0085", "\ufeff"} {
		live := map[string]any{"data": map[string]any{"note": "from an annotation " + r, "image": "app:1"}}
		desired := map[string]any{"data": map[string]any{"note": "from an annotation " + r, "image": "app:2"}}
		d := Diff("ConfigMap.", live, desired)
		if !strings.Contains(d, "-  image: app:1") || !strings.Contains(d, "+  image: app:2") {
			t.Errorf("%q in another field hides the change of image:\n%q", r, d)
		}
		if strings.Contains(d, "-  note") || strings.Contains(d, "+  note") {
			t.Errorf("%q: note, unchanged, is shown changing:\n%q", r, d)
		}
		changed := map[string]any{"data": map[string]any{"note": "from an annotation", "image": "app:1"}}
		if d := Diff("ConfigMap.", live, changed); !strings.Contains(d, "-  note:") || !strings.Contains(d, "+  note: from an annotation\n") {
			t.Errorf("%q taken out of note is not in the diff:\n%q", r, d)
		}
	}
}
