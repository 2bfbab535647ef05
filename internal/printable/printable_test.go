package printable

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// TestTextHostile: what an attacker writes into a name, a message or an
// annotation to act on the terminal of whoever reads it, or to make it
// read what is not there, comes out as visible escapes, and nothing a
// terminal acts on is left.
func TestTextHostile(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"clear screen", "\x1b[2J\x1b[3J\x1b[1;1Hspoofed", `\x1b[2J\x1b[3J\x1b[1;1Hspoofed`},
		{"window title (OSC)", "\x1b]0;pwned\x07", `\x1b]0;pwned\a`},
		{"hidden text (SGR 8)", "ok\x1b[8msecret", `ok\x1b[8msecret`},
		{"C1 CSI", "a\u009b2Jb", `a\u009b2Jb`},
		{"C1 OSC and ST", "\u009d0;t\u009c", `\u009d0;t\u009c`},
		{"DEL and NUL", "a\x7fb\x00c", `a\x7fb\x00c`},
		{"carriage return over the line", "Ready\rFailed", `Ready\rFailed`},
		{"a forged line", "ok\nPlan: 0 to create", `ok\nPlan: 0 to create`},
		{"a forged column", "a\tTrue", `a\tTrue`},
		{"backspace", "abc\b\b\bxyz", `abc\b\b\bxyz`},
		{"bidi override", "txt.\u202egpj.exe", `txt.\u202egpj.exe`},
		{"bidi embeddings and pop", "\u202a\u202b\u202c\u202d", `\u202a\u202b\u202c\u202d`},
		{"bidi isolates", "\u2066\u2067\u2068x\u2069", `\u2066\u2067\u2068x\u2069`},
		{"bidi marks", "\u200e\u200f\u061c", `\u200e\u200f\u061c`},
		{"zero width", "kube\u200b-system\ufeff", `kube\u200b-system\ufeff`},
		{"line separators", "a\u2028b\u2029c\u0085d", `a\u2028b\u2029c\u0085d`},
		{"no-break space", "a\u00a0b", `a\u00a0b`},
		{"invalid UTF-8", "a\xffb\xc3", `a\xffb\xc3`},
		{"a UTF-8 encoded C1 control, then a lone continuation byte", "\xc2\x9b\x80", `\u009b\x80`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Text(tc.in)
			if got != tc.want {
				t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if raw := unsafeRune(got); raw != "" {
				t.Errorf("Text(%q) = %q keeps %s", tc.in, got, raw)
			}
		})
	}
}

// TestTextKeeps: what reads as it is written stays as it is, every
// script and symbol: escaping is for what acts or hides, not for what is
// not ASCII.
func TestTextKeeps(t *testing.T) {
	for _, s := range []string{
		"", "web-7f9c", "NotReady: waiting for resource \"db\" to be ready",
		"Ünïcödé 日本語 العربية עברית ✓ … ├─ └─ │", `a\x1b stays text: C:\path`, "emoji 🚀",
	} {
		if got := Text(s); got != s {
			t.Errorf("Text(%q) = %q, want it unchanged", s, got)
		}
	}
}

// TestTextEveryRune: for every rune and every single byte, what Text
// writes holds nothing a terminal acts on and is valid UTF-8.
func TestTextEveryRune(t *testing.T) {
	check := func(in string) {
		got := Text(in)
		if !utf8.ValidString(got) {
			t.Fatalf("Text(%q) = %q is not valid UTF-8", in, got)
		}
		if raw := unsafeRune(got); raw != "" {
			t.Fatalf("Text(%q) = %q keeps %s", in, got, raw)
		}
	}
	for r := rune(0); r <= utf8.MaxRune; r++ {
		check("x" + string(r) + "y")
	}
	for b := 0; b < 256; b++ {
		check("x" + string([]byte{byte(b)}) + "y")
	}
}

// TestBlock: a text of several lines keeps its lines, each escaped, and
// every line after the first is indented: it cannot start a line of the
// report.
func TestBlock(t *testing.T) {
	got := Block("first\x1b[2J\nPlan: 0 to create\r\n\u202elast", "    ")
	want := "first\\x1b[2J\n    Plan: 0 to create\\r\n    \\u202elast"
	if got != want {
		t.Errorf("Block = %q, want %q", got, want)
	}
	for _, l := range strings.Split(got, "\n")[1:] {
		if !strings.HasPrefix(l, "    ") {
			t.Errorf("line %q is not indented", l)
		}
	}
}

// unsafeRune names the first rune of s a terminal would act on or that
// hides or reorders text; "" when there is none. It is the test's own
// list, written apart from Text's rule.
func unsafeRune(s string) string {
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\ufffd"):
			return "an invalid byte"
		case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0,
			r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069,
			r == 0x200e, r == 0x200f, r == 0x061c, r == 0x200b, r == 0xfeff, r == 0x2028, r == 0x2029:
			return fmt.Sprintf("%U", r)
		}
	}
	return ""
}

// TestYAMLExact: every string, whatever runes it holds — DEL, C1
// controls, NEL, the byte order mark, which yaml.Marshal refuses or
// changes — comes back from YAML's output exactly, as a value and as a
// key; and where yaml.Marshal is exact, YAML writes what it writes.
func TestYAMLExact(t *testing.T) {
	roundTrip := func(s string) (out []byte, exact bool) {
		v := map[string]any{"k": s, s: []any{s}}
		out, err := YAML(v)
		if err != nil {
			t.Fatalf("YAML of %q: %v", s, err)
		}
		var back map[string]any
		if err := yaml.Unmarshal(out, &back); err != nil {
			t.Fatalf("YAML of %q wrote %q, which does not read back: %v", s, out, err)
		}
		if !reflect.DeepEqual(back, v) {
			t.Fatalf("YAML of %q wrote %q, read back as %q", s, out, back)
		}
		plain, err := yaml.Marshal(v)
		var read map[string]any
		if err != nil || yaml.Unmarshal(plain, &read) != nil || !reflect.DeepEqual(read, v) {
			return out, false
		}
		if !bytes.Equal(plain, out) {
			t.Fatalf("YAML of %q wrote %q, yaml.Marshal %q (exact too)", s, out, plain)
		}
		return out, true
	}
	// Every rune, 512 at a time.
	var run []rune
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if r >= 0xd800 && r <= 0xdfff {
			continue
		}
		if run = append(run, r); len(run) == 512 || r == utf8.MaxRune {
			roundTrip("a" + string(run) + "b")
			run = run[:0]
		}
	}
	// One at a time, the first 512 and the last of the Basic
	// Multilingual Plane: which yaml.Marshal cannot write exactly.
	refused := 0
	for r := rune(0); r <= 0xffff; r++ {
		if r == 0x200 {
			r = 0xfe00
		}
		if _, exact := roundTrip("a" + string(r) + "b"); !exact {
			refused++
			if !yamlRefuses(r) {
				t.Errorf("yaml.Marshal is not exact for %U, which YAML does not escape", r)
			}
		}
	}
	if refused != 35 {
		t.Errorf("yaml.Marshal was not exact for %d runes, want 35: DEL, the C1 controls and NEL, the byte order mark, U+FFFE and U+FFFF", refused)
	}
}
