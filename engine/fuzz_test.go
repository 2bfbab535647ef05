package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/rules"
)

func lines(s string) []string { return splitLines(s) }

// applyDiff applies a unified diff made by unifiedDiff to a, checking every
// context and removed line and every hunk header on the way.
func applyDiff(a []string, diff string) ([]string, error) {
	d := lines(diff)
	if len(d) < 2 || d[0] != "--- live" || d[1] != "+++ desired" {
		return nil, fmt.Errorf("no diff header: %q", diff)
	}
	var out []string
	i := 0 // next line of a
	for k := 2; k < len(d); {
		as, al, bs, bl, err := hunkHeader(d[k])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", k, err)
		}
		start := as - 1
		if al == 0 {
			start = as
		}
		if start < i || start > len(a) {
			return nil, fmt.Errorf("hunk %q starts at %d, before line %d or past the end", d[k], start, i)
		}
		out = append(out, a[i:start]...)
		if got := len(out) + 1; bl > 0 && got != bs || bl == 0 && got-1 != bs {
			return nil, fmt.Errorf("hunk %q: new side starts at %d", d[k], got)
		}
		i = start
		k++
		seenA, seenB := 0, 0
		for ; k < len(d) && !strings.HasPrefix(d[k], "@@ "); k++ {
			if d[k] == "" {
				return nil, fmt.Errorf("empty diff line %d", k)
			}
			op, text := d[k][0], d[k][1:]
			switch op {
			case ' ', '-':
				if i >= len(a) || a[i] != text {
					return nil, fmt.Errorf("line %d %q does not match %q", k, d[k], a[min(i, len(a)-1)])
				}
				i++
				seenA++
				if op == ' ' {
					out = append(out, text)
					seenB++
				}
			case '+':
				out = append(out, text)
				seenB++
			default:
				return nil, fmt.Errorf("bad diff line %q", d[k])
			}
		}
		if seenA != al || seenB != bl {
			return nil, fmt.Errorf("hunk -%d,%d +%d,%d holds %d and %d lines", as, al, bs, bl, seenA, seenB)
		}
	}
	return append(out, a[i:]...), nil
}

// hunkHeader parses "@@ -start,len +start,len @@"; a range of one line may
// leave its length out ("-3"), as the unified format allows.
func hunkHeader(h string) (as, al, bs, bl int, err error) {
	ranges, prefixed := strings.CutPrefix(h, "@@ -")
	ranges, suffixed := strings.CutSuffix(ranges, " @@")
	if !prefixed || !suffixed {
		return 0, 0, 0, 0, fmt.Errorf("bad hunk header %q", h)
	}
	a, b, ok := strings.Cut(ranges, " +")
	parse := func(r string) (start, length int, err error) {
		s, l, short := strings.Cut(r, ",")
		length = 1
		if short {
			if length, err = strconv.Atoi(l); err != nil {
				return 0, 0, err
			}
		}
		start, err = strconv.Atoi(s)
		return start, length, err
	}
	if !ok {
		return 0, 0, 0, 0, fmt.Errorf("bad hunk header %q", h)
	}
	if as, al, err = parse(a); err == nil {
		bs, bl, err = parse(b)
	}
	if err != nil {
		err = fmt.Errorf("bad hunk header %q: %w", h, err)
	}
	return as, al, bs, bl, err
}

func checkDiff(t *testing.T, a, b string) string {
	t.Helper()
	d := unifiedDiff(a, b)
	if slices.Equal(lines(a), lines(b)) {
		if d != "" {
			t.Fatalf("diff of texts of equal lines: %q", d)
		}
		return d
	}
	got, err := applyDiff(lines(a), d)
	if err != nil {
		t.Fatalf("%v\ndiff:\n%s", err, d)
	}
	if want := lines(b); strings.Join(got, "\n") != strings.Join(want, "\n") || len(got) != len(want) {
		t.Fatalf("applying the diff gives %q, want %q\ndiff:\n%s", got, want, d)
	}
	return d
}

// FuzzUnifiedDiff: the diff of any two texts, applied to the first, gives
// the second.
func FuzzUnifiedDiff(f *testing.F) {
	for _, s := range [][2]string{
		{"", ""}, {"", "a\n"}, {"a\n", ""}, {"a\nb\nc\n", "a\nc\n"}, {"a\n", "b\n"},
		{"1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "1\n2\nX\n4\n5\n6\n7\n8\n9\n10\nY\n12\n"},
		{"a\n\n\n", "a\n"}, {"x", "x\ny\nz"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) { checkDiff(t, a, b) })
}

// TestUnifiedDiffLarge: texts whose comparison table would be too large get
// one whole-object hunk, which still applies.
func TestUnifiedDiffLarge(t *testing.T) {
	var a, b strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&a, "line %d\n", i)
		fmt.Fprintf(&b, "line %d\n", i+1)
	}
	d := checkDiff(t, a.String(), b.String())
	if !strings.Contains(d, "@@ -1,3000 +1,3000 @@") {
		t.Errorf("not one whole hunk: %.200s", d)
	}
}

// structure is every rune of a redacted Secret diff's skeleton: a value
// made only of these could appear in the output by coincidence. Past the
// digits and punctuation, the letters of "apiVersion: v1", "kind: Secret",
// "data", "stringData", "(redacted, sha256:…)", "live" and "desired", each
// once.
const structure = "-+@, \n0123456789abcdef:()piVrsonvkStgDhl"

// FuzzPlanDiff: a plan's diff of two arbitrary objects applies, a JSON plan
// line is valid JSON that round-trips, and no Secret value reaches a diff.
func FuzzPlanDiff(f *testing.F) {
	f.Add("data: {a: b}", "data: {a: c, d: e}", "Hunter2!", "rule", "name")
	f.Add("{}", "spec: {replicas: 3}", "P@ssw0rd-XYZ", "r", "n")
	f.Add("metadata: {annotations: {syncloop.dev/applied-hash: x}}", "metadata: {labels: {a: b}}", "ÄÖÜ", "r\n", "\"quoted\"")
	f.Fuzz(func(t *testing.T, live, desired, secret, rule, name string) {
		var l, d map[string]any
		if yaml.Unmarshal([]byte(live), &l) != nil || yaml.Unmarshal([]byte(desired), &d) != nil || l == nil || d == nil {
			return
		}
		diff := diffObjects("ConfigMap.", l, d, d)
		a, b := forDiff("ConfigMap.", project(l, d)), forDiff("ConfigMap.", project(d, d))
		if diff != unifiedDiff(a, b) {
			t.Fatal("diffObjects is not the diff of the projections")
		}
		checkDiff(t, a, b)

		liveS := map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"k": secret}, "stringData": map[string]any{"k": secret}}
		wantS := map[string]any{"data": map[string]any{"k": secret + "!"}, "stringData": map[string]any{"k": "~" + secret}}
		sd := diffObjects("Secret.", liveS, wantS, wantS)
		if strings.Trim(secret, structure) != "" && strings.Contains(sd, secret) {
			t.Fatalf("a Secret value reached the diff:\n%s", sd)
		}

		var out bytes.Buffer
		p := NewPlanPrinter(&out, io.Discard, true, true)
		a1 := Action{Action: ActionUpdate, Rule: rule, Object: rules.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Name: name}, Diff: diff + sd}
		p.Plan(a1)
		var back Action
		if err := json.Unmarshal(bytes.TrimSuffix(out.Bytes(), []byte("\n")), &back); err != nil {
			t.Fatalf("JSON plan line %q: %v", out.String(), err)
		}
		if utf8.ValidString(rule) && back.Rule != rule || utf8.ValidString(a1.Diff) && back.Diff != a1.Diff {
			t.Fatalf("round trip: rule %q → %q, diff %q → %q", rule, back.Rule, a1.Diff, back.Diff)
		}
		var text bytes.Buffer
		NewPlanPrinter(&text, io.Discard, false, true).Plan(a1)
		if !strings.Contains(text.String(), "(rule ") {
			t.Fatalf("text plan: %q", text.String())
		}
	})
}
