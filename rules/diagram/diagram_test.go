package diagram

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

var update = flag.Bool("update", false, "rewrite golden files")

func load(t *testing.T, path string) *rules.Set {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set, err := l.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestOf: the edges are the compiled references — lookup to lookup,
// lookup to resource (through a variable too), resource to resource and
// to the status — and those that hold back what they lead to wait; the
// trigger leads to what reads nothing else.
func TestOf(t *testing.T) {
	g := Of(load(t, "testdata/everything.yaml").Rules()[0], "")
	want := []Edge{
		{From: "trigger", To: "lookup_team"},
		{From: "lookup_team", To: "lookup_members", Via: "lookups.team", Waits: true},
		{From: "trigger", To: "res_account"},
		{From: "lookup_members", To: "res_account", Via: "lookups.members"},
		{From: "res_account", To: "res_binding", Via: "children.account", Waits: true},
		{From: "trigger", To: "res_mark"},
		{From: "lookup_team", To: "res_mark", Via: "lookups.team", Waits: true},
		{From: "trigger", To: "res_seed"},
		{From: "res_binding", To: "status", Via: "children.binding"},
		{From: "lookup_members", To: "status", Via: "lookups.members"},
	}
	if !slices.Equal(g.Edges, want) {
		t.Errorf("edges:\n got %+v\nwant %+v", g.Edges, want)
	}
	shapes := map[string]Shape{}
	for _, n := range g.Nodes {
		shapes[n.ID] = n.Shape
		switch n.ID {
		case "res_account":
			if !n.Many || n.Conditional {
				t.Errorf("forEach resource: Many %v Conditional %v", n.Many, n.Conditional)
			}
		case "res_binding":
			if !n.Conditional || n.Many {
				t.Errorf("resource with a when: Many %v Conditional %v", n.Many, n.Conditional)
			}
		case "lookup_team":
			if !n.Required || n.Many {
				t.Errorf("required lookup by name: Required %v Many %v", n.Required, n.Many)
			}
		case "lookup_members":
			if n.Required || !n.Many {
				t.Errorf("list lookup: Required %v Many %v", n.Required, n.Many)
			}
		}
	}
	if shapes["res_mark"] != Patch || shapes["status"] != Status || shapes["trigger"] != Trigger || shapes["res_seed"] != Child {
		t.Errorf("shapes: %v", shapes)
	}
}

// TestWrite compares both formats with their golden files.
func TestWrite(t *testing.T) {
	g := []*Graph{Of(load(t, "testdata/everything.yaml").Rules()[0], "")}
	for name, write := range map[string]func(*bytes.Buffer, []*Graph) error{
		"everything.mmd": func(b *bytes.Buffer, g []*Graph) error { return Mermaid(b, g) },
		"everything.dot": func(b *bytes.Buffer, g []*Graph) error { return Dot(b, g) },
	} {
		var b bytes.Buffer
		if err := write(&b, g); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Errorf("%s differs (-update rewrites it):\n%s", path, b.String())
		}
	}
}

// TestText: what Mermaid and dot would read as syntax is escaped, and an
// expression is shortened to one line.
func TestText(t *testing.T) {
	for in, want := range map[string]string{
		`a "b" <c> | #d`: `"a #quot;b#quot; #lt;c#gt; #124; #35;d"`,
		"<b>x<y</b>":     `"<b>x#lt;y</b>"`,
	} {
		if got := mermaidText(in); got != want {
			t.Errorf("mermaidText(%q) = %s, want %s", in, got, want)
		}
	}
	if got, want := dotQuote("a\"b\\c\nd"), `"a\"b\\c\nd"`; got != want {
		t.Errorf("dotQuote = %s, want %s", got, want)
	}
	long := "a &&\n   b" + string(bytes.Repeat([]byte("x"), 100))
	if got := []rune(clip(long)); len(got) != maxExpr || string(got[:6]) != "a && b" || got[len(got)-1] != '…' {
		t.Errorf("clip = %q", string(got))
	}
	if got := sanitize("network-policy.v1"); got != "network_2d_policy_2e_v1" {
		t.Errorf("sanitize = %q", got)
	}
}

// TestWriteHostile: what a rule's expressions quote — a string holding
// escape sequences, a bell, a bidi override, a C1 control — is drawn
// escaped in Mermaid and dot: the graph printed to a terminal cannot act
// on it, and each label stays one line of its format.
func TestWriteHostile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rule.yaml")
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: hostile}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  when: "object.metadata.name != '\e[2J\e]0;pwned\a\u202e\x9b'"
  resources:
    - id: cm
      when: "object.metadata.name != '\e[8m'"
      readyWhen: ["self.metadata.name != '\u2066\x7f'"]
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}}
`
	if err := os.WriteFile(path, []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	g := []*Graph{Of(load(t, path).Rules()[0], "")}
	for name, write := range map[string]func(*bytes.Buffer, []*Graph) error{
		"mermaid": func(b *bytes.Buffer, g []*Graph) error { return Mermaid(b, g) },
		"dot":     func(b *bytes.Buffer, g []*Graph) error { return Dot(b, g) },
	} {
		var b bytes.Buffer
		if err := write(&b, g); err != nil {
			t.Fatal(err)
		}
		for _, r := range b.String() {
			if r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
				t.Errorf("%s holds %U raw:\n%s", name, r, b.String())
				break
			}
		}
		if !bytes.Contains(b.Bytes(), []byte(`x1b[2J`)) || !bytes.Contains(b.Bytes(), []byte(`u202e`)) {
			t.Errorf("%s does not show the expressions' strings escaped:\n%s", name, b.String())
		}
	}
}
