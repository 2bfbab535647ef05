package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/internal/manager"
)

// hostile is what an attacker who can write a name, an annotation, an
// Event, a condition or a rule's string puts there to act on the terminal
// of whoever prints it, or to make the report say what is not so: clear
// the screen and move to its top, set the window title, hide what
// follows, return over the line, forge a line and a column, reverse what
// is read, a C1 CSI. It is valid UTF-8, as everything the API server
// serves is.
const hostile = "h\x1b[2J\x1b[1;1H\x1b]0;pwned\x07\x1b[8m\rReady=True\n\tFORGED all ready\u202etxt.exe\u2066\u009b2J\x7f"

// fillStrings sets every string reachable from v (a pointer) — fields,
// slice and array elements, map values — to value and a number of its
// own, and gives every nil slice one element and every nil pointer a
// value to fill: a printer is given hostile text in every place it could
// print from, those added later too.
func fillStrings(t *testing.T, v any, value string) {
	t.Helper()
	n := 0
	var fill func(reflect.Value)
	fill = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			if v.CanSet() {
				n++
				v.SetString(fmt.Sprintf("%s#%d", value, n))
			}
		case reflect.Pointer:
			if v.IsNil() && v.CanSet() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			if !v.IsNil() {
				fill(v.Elem())
			}
		case reflect.Struct:
			if v.Type() == reflect.TypeFor[time.Time]() {
				return
			}
			for i := range v.NumField() {
				if v.Type().Field(i).IsExported() {
					fill(v.Field(i))
				}
			}
		case reflect.Slice:
			if v.IsNil() && v.CanSet() {
				v.Set(reflect.MakeSlice(v.Type(), 1, 1))
			}
			for i := range v.Len() {
				fill(v.Index(i))
			}
		case reflect.Map:
			if v.Type().Elem().Kind() == reflect.String && v.CanSet() {
				if v.IsNil() {
					v.Set(reflect.MakeMap(v.Type()))
				}
				n++
				v.SetMapIndex(reflect.ValueOf(fmt.Sprintf("k%d", n)).Convert(v.Type().Key()), reflect.ValueOf(fmt.Sprintf("%s#%d", value, n)))
			}
		}
	}
	fill(reflect.ValueOf(v))
	if n < 3 {
		t.Fatalf("filled %d strings of %T: the test fills nothing", n, v)
	}
}

// assertPrintable fails t when out, the text a printer wrote for a
// person, holds a byte a terminal would act on — a control character but
// the newlines between lines, DEL, a C1 control, a bidirectional override
// or isolate, a byte that is not UTF-8 — or a line that hostile forged.
func assertPrintable(t *testing.T, what, out string) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if !utf8.ValidString(line) {
			t.Errorf("%s: line %d holds bytes that are not UTF-8: %q", what, i+1, line)
		}
		for _, r := range line {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
				t.Errorf("%s: line %d holds %U raw: %q", what, i+1, r, line)
				break
			}
		}
		if strings.HasPrefix(strings.TrimLeft(line, " │├└─"), "FORGED") {
			t.Errorf("%s: a value forged line %d: %q", what, i+1, line)
		}
	}
}

// assertShown fails t when out does not show hostile escaped, as Text
// writes it.
func assertShown(t *testing.T, what, out string) {
	t.Helper()
	if !strings.Contains(out, `h\x1b[2J\x1b[1;1H\x1b]0;pwned\a\x1b[8m\rReady=True\n\tFORGED all ready\u202etxt.exe\u2066\u009b2J\x7f`) {
		t.Errorf("%s: the hostile values are not shown escaped:\n%s", what, out)
	}
}

// TestTraceTextHostile: whatever the cluster and the rules put in a
// trace — the trigger's and children's names, lookups, states, drift,
// conflicts, errors, conditions, Events — trace's text and wide output
// show it escaped, each value on its own line and in its own column,
// while -o json and -o yaml hold every value exactly.
func TestTraceTextHostile(t *testing.T) {
	rep := &manager.TraceReport{}
	fillStrings(t, rep, hostile)
	rep.Rules[0].Resources[0].State = manager.TraceNotReady
	for _, format := range []string{"text", "wide"} {
		var out strings.Builder
		if err := writeTrace(&out, rep, format, time.Now()); err != nil {
			t.Fatal(err)
		}
		assertPrintable(t, "trace -o "+format, out.String())
		assertShown(t, "trace -o "+format, out.String())
		if rows := strings.Count(out.String(), "\n"); rows != 14 {
			t.Errorf("trace -o %s wrote %d lines, want 14 (a header, 7 rows, conditions and events): values forged lines\n%s", format, rows, out.String())
		}
	}
	var tty strings.Builder
	rep.Ready = false
	(&screen{w: &tty, width: 80}).show(watchHeading(rep, time.Now())+"\n", "1")
	assertPrintable(t, "trace --watch heading", strings.TrimSuffix(tty.String(), "\n"))
	assertShown(t, "trace --watch heading", tty.String())

	var out strings.Builder
	if err := writeTrace(&out, rep, "json", time.Now()); err != nil {
		t.Fatal(err)
	}
	var back manager.TraceReport
	if err := json.Unmarshal([]byte(out.String()), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, rep) {
		t.Errorf("trace -o json does not hold the values exactly:\n%s", out.String())
	}
	out.Reset()
	if err := writeTrace(&out, rep, "yaml", time.Now()); err != nil {
		t.Fatal(err)
	}
	back = manager.TraceReport{}
	if err := yaml.Unmarshal([]byte(out.String()), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, rep) {
		t.Errorf("trace -o yaml does not hold the values exactly:\n%s", out.String())
	}
}

// TestRolloutStatusHostile: a revision whose labels and annotations (its
// rule, name, hash, rollout and removal records) and a storage migration
// whose CRD's names hold escape sequences print in rollout status's text
// escaped, each value in its column, each record on its two lines; -o
// json holds them exactly.
func TestRolloutStatusHostile(t *testing.T) {
	revs := []manager.Revision{{}}
	fillStrings(t, &revs, hostile)
	revs[0].Newest = true
	var out strings.Builder
	if err := printRevisions(&out, revs); err != nil {
		t.Fatal(err)
	}
	migrations := []manager.Migration{{}}
	fillStrings(t, &migrations, hostile)
	printMigrations(&out, migrations)
	assertPrintable(t, "rollout status", out.String())
	assertShown(t, "rollout status", out.String())
	// The table's head and row, the rollout's and the removal's two lines,
	// the migration's one.
	if lines := strings.Count(out.String(), "\n"); lines != 7 {
		t.Errorf("rollout status wrote %d lines, want 7: values forged lines\n%s", lines, out.String())
	}
	data, err := json.Marshal(map[string]any{"revisions": revs})
	if err != nil {
		t.Fatal(err)
	}
	var back struct{ Revisions []manager.Revision }
	if err := json.Unmarshal(data, &back); err != nil || back.Revisions[0].Rollout.Message != revs[0].Rollout.Message || back.Revisions[0].Name != revs[0].Name {
		t.Errorf("rollout status -o json does not hold the values exactly (%v)", err)
	}
}

// TestFinalizersListHostile: objects whose kinds (a CRD's names), names
// and finalizers hold escape sequences print in finalizers list escaped,
// one row each.
func TestFinalizersListHostile(t *testing.T) {
	held := []manager.Held{{}, {}}
	fillStrings(t, &held, hostile)
	var out strings.Builder
	if err := printHeld(&out, held); err != nil {
		t.Fatal(err)
	}
	assertPrintable(t, "finalizers list", out.String())
	assertShown(t, "finalizers list", out.String())
	if lines := strings.Count(out.String(), "\n"); lines != 3 {
		t.Errorf("finalizers list wrote %d lines, want 3 (head, two rows): values forged lines\n%s", lines, out.String())
	}
}

// TestTestOutputHostile: a Test file whose test's name and expected
// values hold escape sequences, returns, forged PASS lines and bidi
// controls prints its FAIL and the values that differ escaped: no
// line of the file's passes for a PASS.
func TestTestOutputHostile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "rules.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: note}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: note, namespace: "${object.metadata.name}"}
        data: {note: "${object.metadata.annotations.note}"}
`)
	writeFile(t, dir, "objects.yaml", `apiVersion: v1
kind: Namespace
metadata: {name: shop, annotations: {note: "\e[2J\e]0;pwned\a\rPASS all\u202e\x9b"}}
`)
	test := writeFile(t, dir, "test.yaml", "apiVersion: syncloop.dev/v1alpha1\nkind: Test\nmetadata: {name: \"\\e[8mhidden\\nPASS forged: it\"}\n"+
		"rules: [rules.yaml]\nobjects: [objects.yaml]\nexpect:\n- rule: note\n  trigger: {kind: Namespace, name: shop}\n"+
		"  children:\n  - {apiVersion: v1, kind: ConfigMap, metadata: {name: note, namespace: shop}, data: {note: \"\\e[3J\\nPASS x\\u2066\"}}\n")
	code, out, errOut := syncloop(t, "test", test)
	if code != 1 {
		t.Fatalf("test exited %d, want 1 (a failure):\n%s%s", code, out, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "PASS") {
			t.Errorf("a value forged a PASS line: %q", l)
		}
	}
	assertPrintable(t, "test", out)
	if !strings.Contains(out, `\x1b[8mhidden\nPASS forged: it`) || !strings.Contains(out, `\u001b[3J\nPASS x\u2066`) ||
		!strings.Contains(out, `PASS all\u202e\u009b`) {
		t.Errorf("test does not show the file's values escaped:\n%s", out)
	}
}

// TestErrorHostile: an error that quotes what it was given — a file name
// holding escape sequences and a forged line — prints escaped, its lines
// indented under "Error:".
func TestErrorHostile(t *testing.T) {
	code, out, errOut := syncloop(t, "validate", "-f", filepath.Join(t.TempDir(), "\x1b]0;pwned\x07\nError: none.yaml"))
	if code == 0 {
		t.Fatalf("validate of a file that is not there exited 0: %s", out)
	}
	for _, l := range strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")[1:] {
		if !strings.HasPrefix(l, "  ") {
			t.Errorf("a line of the error is not under it: %q", l)
		}
	}
	assertPrintable(t, "an error", errOut)
	if !strings.Contains(errOut, `\x1b]0;pwned\a`+"\n  Error: none.yaml") {
		t.Errorf("the error does not show the file's name escaped:\n%s", errOut)
	}
}

// TestTraceHostileCluster: what anyone who may write an Event, a
// trigger's annotations or its status puts there — escape sequences, a
// return, a forged line, bidi overrides, a C1 control — reaches trace
// from a real API server, through an Event's reason and message, a
// condition's reason and message, and a lookup whose name the rule
// renders from an annotation: trace's text shows each escaped on its own
// line, and -o json and -o yaml hold each exactly.
//
// API server: Events and status conditions hold any text.
func TestTraceHostileCluster(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	if _, err := env.InstallCRDs(ctx, filepath.Join("testdata", "widgets-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "trace-hostile")
	widgets := dc.Resource(schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	w, err := widgets.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "test.syncloop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "annotations": map[string]any{"note": hostile}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False", "reason": "Bad\x1b[2J", "message": hostile,
		"lastTransitionTime": "2026-01-02T03:04:05Z"}}}
	if w, err = widgets.UpdateStatus(ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "spoof"}, Type: "Warning", Reason: "Spoof\x1b]0;pwned\x07", Message: hostile,
		InvolvedObject: corev1.ObjectReference{APIVersion: "test.syncloop.dev/v1", Kind: "Widget", Namespace: ns, Name: "w", UID: w.GetUID()},
		LastTimestamp:  metav1.Now()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	file := writeFile(t, t.TempDir(), "rule.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: hostile}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget}
  lookups:
    - id: noted
      apiVersion: v1
      kind: ConfigMap
      name: "${object.metadata.annotations.note}"
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-note"}
        data: {note: "${object.metadata.annotations.note}"}
`)
	args := []string{"trace", "widget.test.syncloop.dev", "w", "-n", ns, "-f", file, "--kubeconfig", env.Kubeconfig()}
	code, out, errOut := syncloop(t, args...)
	if code != 3 {
		t.Fatalf("trace exited %d, want 3 (not ready):\n%s%s", code, out, errOut)
	}
	assertPrintable(t, "trace", out)
	assertPrintable(t, "trace's stderr", errOut)
	for _, want := range []string{`Spoof\x1b]0;pwned\a: h\x1b[2J`, `Ready=False Bad\x1b[2J: h\x1b[2J`, `lookup noted: ConfigMap`} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q:\n%s", want, out)
		}
	}
	assertShown(t, "trace", out)

	for _, format := range []string{"json", "yaml"} {
		code, out, errOut = syncloop(t, append(args, "-o", format)...)
		var rep manager.TraceReport
		decode := yaml.Unmarshal // which reads JSON too, but not with DEL or a C1 control raw in it, as encoding/json writes them
		if format == "json" {
			decode = func(data []byte, v any, _ ...yaml.JSONOpt) error { return json.Unmarshal(data, v) }
		}
		if err := decode([]byte(out), &rep); code != 3 || err != nil {
			t.Fatalf("trace -o %s exited %d (%v):\n%s%s", format, code, err, out, errOut)
		}
		if len(rep.Events) != 1 || rep.Events[0].Message != hostile || rep.Events[0].Reason != "Spoof\x1b]0;pwned\x07" ||
			len(rep.Conditions) != 1 || rep.Conditions[0].Message != hostile || rep.Conditions[0].Reason != "Bad\x1b[2J" ||
			len(rep.Rules) != 1 || len(rep.Rules[0].Lookups) != 1 || !strings.Contains(rep.Rules[0].Lookups[0].Query, hostile) {
			t.Errorf("trace -o %s does not hold the cluster's values exactly: %+v", format, rep)
		}
	}
}
