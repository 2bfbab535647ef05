package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestGraphExamples draws every example's rules: the Mermaid graph is the
// one its README shows (the app's also docs/rules.md's), the dot graph its golden file's. -update rewrites
// both.
func TestGraphExamples(t *testing.T) {
	for _, name := range exampleDirs(t) {
		t.Run(name, func(t *testing.T) {
			rules := filepath.Join(examplesDir, name, "rules.yaml")
			code, mermaid, errOut := syncloop(t, "graph", "-f", rules)
			if code != 0 {
				t.Fatalf("graph exited %d: %s", code, errOut)
			}
			if !strings.HasPrefix(mermaid, "flowchart LR\n") || !strings.Contains(mermaid, "trigger([") {
				t.Errorf("graph printed no flowchart with a trigger:\n%s", mermaid)
			}
			readmeBlock(t, filepath.Join(examplesDir, name, "README.md"), "graph", "mermaid", mermaid)
			if name == "app" { // docs/rules.md shows it too
				readmeBlock(t, filepath.Join("..", "..", "docs", "rules.md"), "graph", "mermaid", mermaid)
			}
			code, dot, errOut := syncloop(t, "graph", "-f", rules, "-o", "dot")
			if code != 0 {
				t.Fatalf("graph -o dot exited %d: %s", code, errOut)
			}
			golden(t, filepath.Join("testdata", "examples", name+".dot"), dot)
		})
	}
}

// TestGraphCommand: --rule draws one rule of several, alone and without
// prefixes; a rule not there, an unknown format and a broken rule file
// are errors.
func TestGraphCommand(t *testing.T) {
	rules := filepath.Join(examplesDir, "replicate", "rules.yaml")
	code, out, errOut := syncloop(t, "graph", "-f", rules, "--rule", "replicate-secrets")
	if code != 0 {
		t.Fatalf("graph --rule exited %d: %s", code, errOut)
	}
	if strings.Contains(out, "ConfigMap") || strings.Contains(out, "subgraph") || !strings.Contains(out, "  trigger([\"<b>Secret</b>") {
		t.Errorf("graph --rule replicate-secrets drew more or less than that rule:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rule", "nope"}, `no rule "nope"`},
		{[]string{"-o", "svg"}, "--output must be mermaid or dot"},
	} {
		code, _, errOut := syncloop(t, append([]string{"graph", "-f", rules}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("graph %v exited %d, stderr %q; want an error with %q", c.args, code, errOut, c.want)
		}
	}
	bad := writeFile(t, t.TempDir(), "bad.yaml", "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: bad}\nspec:\n  watch: {apiVersion: v1, kind: ConfigMap}\n  resources:\n    - id: a\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: '${object.nope(}'}}\n")
	if code, _, errOut := syncloop(t, "graph", "-f", bad); code != 1 || !strings.Contains(errOut, "bad.yaml:8:") {
		t.Errorf("graph of a broken rule exited %d, stderr %q; want 1 with the error at bad.yaml:8", code, errOut)
	}
}
