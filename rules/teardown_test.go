package rules

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// wavesDoc is a rule whose resources read each other as a diamond and a
// tail: b and c read a, d reads c, e reads nothing.
const wavesDoc = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: r}
spec:
  watch: {apiVersion: v1, kind: Namespace}
TEARDOWN  resources:
    - {id: a, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: default}}}
    - {id: b, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: b, namespace: default}, data: {a: "${children.a.metadata.name}"}}}
    - {id: c, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: default}, data: {a: "${children.a.metadata.name}"}}}
    - {id: d, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: d, namespace: default}, data: {c: "${children.c.metadata.name}"}}}
    - {id: e, template: {apiVersion: v1, kind: ConfigMap, metadata: {name: e, namespace: default}}}
`

// TestTeardownWaves: a resource's wave is one after the latest of those
// that read it, so a resource goes only once all its readers are gone;
// teardown is Unordered unless asked for (or the rule defines its kind,
// TestKroWebApplication), and an ordered rule says what it needs.
func TestTeardownWaves(t *testing.T) {
	r := parseRule(t, strings.Replace(wavesDoc, "TEARDOWN", "  teardown: Ordered\n", 1))
	var got []string
	for _, res := range r.Resources {
		got = append(got, fmt.Sprintf("%s:%d", res.ID, res.Wave))
	}
	if s := strings.Join(got, " "); s != "a:2 b:0 c:1 d:0 e:0" {
		t.Errorf("waves %s, want a:2 b:0 c:1 d:0 e:0", s)
	}
	if r.Waves() != 3 || !r.OrdersTeardown() || r.TeardownFinalizer() != "teardown.syncloop.dev/r" {
		t.Errorf("waves %d, ordered %v, finalizer %s", r.Waves(), r.OrdersTeardown(), r.TeardownFinalizer())
	}
	if r := parseRule(t, strings.Replace(wavesDoc, "TEARDOWN", "", 1)); r.Teardown != TeardownUnordered || r.OrdersTeardown() {
		t.Errorf("teardown %s by default without spec.api, want Unordered", r.Teardown)
	}

	api, err := newLoader(t).Load(filepath.Join("testdata", "api", "webapp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if r := api.Get("webapp"); r.Teardown != TeardownOrdered {
		t.Errorf("a rule with spec.api tears down %s by default, want Ordered", r.Teardown)
	}

	l := newLoader(t)
	if err := l.SetInstallation("blue"); err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("r.yaml", []byte(strings.Replace(wavesDoc, "TEARDOWN", "  teardown: Ordered\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if fin := f.Rules[0].TeardownFinalizer(); fin != "blue.teardown.syncloop.dev/r" || !IsTeardownFinalizer(fin, "blue") || IsTeardownFinalizer(fin, "") {
		t.Errorf("finalizer %s of installation blue", fin)
	}
	want := `r.yaml:6:13: rule "r": spec.teardown: note: its triggers carry the finalizer blue.teardown.syncloop.dev/r while they have children, deleted dependents first in 3 waves: the rule needs patch on v1 Namespace`
	if len(f.Notes) != 1 || f.Notes[0].Error() != want {
		t.Errorf("notes %v, want\n%s", f.Notes, want)
	}

	flat := strings.Replace(wavesDoc, "TEARDOWN", "  teardown: Ordered\n", 1)
	for _, id := range []string{"a", "c"} {
		flat = strings.ReplaceAll(flat, "${children."+id+".metadata.name}", "${object.metadata.name}")
	}
	f, err = newLoader(t).Parse("r.yaml", []byte(flat))
	if err != nil {
		t.Fatal(err)
	}
	if r := f.Rules[0]; r.OrdersTeardown() || len(f.Notes) != 1 || !strings.Contains(f.Notes[0].Error(), "Ordered has nothing to order") {
		t.Errorf("a rule whose resources read none: ordered %v, notes %v", r.OrdersTeardown(), f.Notes)
	}
	if _, err := newLoader(t).Parse("r.yaml", []byte(strings.Replace(wavesDoc, "TEARDOWN", "  teardown: Later\n", 1))); err == nil ||
		!strings.Contains(err.Error(), "spec.teardown") {
		t.Errorf("teardown: Later loaded: %v", err)
	}
}

// TestRemovalPolicy: a removed rule orphans its children unless it says
// removalPolicy: Delete, which validate -v=2 notes with its bound.
func TestRemovalPolicy(t *testing.T) {
	if r := parseRule(t, strings.Replace(wavesDoc, "TEARDOWN", "", 1)); r.RemovalPolicy != DeletionOrphan {
		t.Errorf("removalPolicy %s by default, want Orphan", r.RemovalPolicy)
	}
	f, err := newLoader(t).Parse("r.yaml", []byte(strings.Replace(wavesDoc, "TEARDOWN", "  removalPolicy: Delete\n  rollout: {maxPrunes: 3}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	want := `r.yaml:6:18: rule "r": spec.removalPolicy: note: removing the rule deletes its children, dependents first — unless they are more than rollout.maxPrunes (3) of them: then the removal halts and deletes none`
	if r := f.Rules[0]; r.RemovalPolicy != DeletionDelete || len(f.Notes) != 1 || f.Notes[0].Error() != want {
		t.Errorf("removalPolicy %s, notes %v, want\n%s", r.RemovalPolicy, f.Notes, want)
	}
	if _, err := newLoader(t).Parse("r.yaml", []byte(strings.Replace(wavesDoc, "TEARDOWN", "  removalPolicy: Later\n", 1))); err == nil ||
		!strings.Contains(err.Error(), "spec.removalPolicy") {
		t.Errorf("removalPolicy: Later loaded: %v", err)
	}
}
