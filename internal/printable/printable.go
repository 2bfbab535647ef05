// Package printable writes values that came from elsewhere — the
// cluster, a rule, a file — so that they print as they are: for a person,
// as text a terminal shows and never acts on (clear the screen, set the
// window's title, move the cursor, hide what follows) and that cannot
// pass for something else (a line of the report, text read in another
// order, a column); for a program, as YAML that holds every string
// exactly, whatever runes it holds.
//
// It owns those two decisions, for every printer: the human-readable
// ones (trace, plan and its diffs, rollout status, finalizers, validate,
// test, graph, /readyz, errors) call Text or Block on each value; the
// YAML ones call YAML. It knows nothing of what is printed. JSON needs
// nothing of it: encoding/json writes every string exactly.
package printable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// Text returns s with every rune that a terminal would act on or that
// reads as something it is not written as a Go escape, as %q writes it:
// C0 and C1 controls, ESC, DEL (\x1b, \u009b, \x7f, and \n, \r, \t
// themselves, so that one value stays on its line and in its column),
// bidirectional overrides and isolates (\u202e, \u2066), zero-width and
// other format characters, separators other than the ASCII space
// (\u00a0, \u2028), and each byte that is not valid UTF-8 (\xff).
// Letters, marks, numbers, punctuation and symbols of every script are
// kept, so is the space; so is a backslash, so a value may show a
// backslash escape it holds as text, never act as one. s is returned
// as it is when it holds nothing to escape.
func Text(s string) string {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !shown(r, n) {
			return escape(s, i)
		}
		i += n
	}
	return s
}

// Block is s, a text of several lines (a diff, an error with detail),
// each line made safe by Text and every line after the first begun with
// indent: a line of s cannot pass for a line of the report it is in.
func Block(s, indent string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Text(l)
	}
	return strings.Join(lines, "\n"+indent)
}

// shown says whether r, decoded from n bytes, is written as it is.
func shown(r rune, n int) bool {
	if r == utf8.RuneError && n == 1 {
		return false // a byte that is not UTF-8
	}
	return strconv.IsPrint(r)
}

// escape is Text of s, whose first rune to escape starts at from.
func escape(s string, from int) string {
	const hex = "0123456789abcdef"
	b := make([]byte, 0, len(s)+16)
	b = append(b, s[:from]...)
	var q [16]byte
	for i := from; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case shown(r, n):
			b = append(b, s[i:i+n]...)
		case r == utf8.RuneError && n == 1:
			b = append(b, '\\', 'x', hex[s[i]>>4], hex[s[i]&0xf])
		default:
			e := strconv.AppendQuoteRune(q[:0], r) // '\x1b', '\u202e': the escape between the quotes
			b = append(b, e[1:len(e)-1]...)
		}
		i += n
	}
	return string(b)
}

// YAML is v as sigs.k8s.io/yaml.Marshal writes it (through its JSON
// form: field names and omitempty as encoding/json has them), except that
// every string holds exactly what it held. yaml.Marshal fails on a string
// holding DEL or a C1 control ("control characters are not allowed") and
// reads a NEL as a line break: it hands encoding/json's text, which
// leaves those runes raw, to a YAML 1.1 reader that refuses them. Here
// they reach it as JSON escapes, which it decodes to themselves; its
// writer then escapes them in double quotes.
func YAML(v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("error marshaling into JSON: %w", err)
	}
	return yaml.JSONToYAML(escapeForYAML(j))
}

// escapeForYAML writes, in j, a JSON text, each rune a YAML 1.1 reader
// refuses or takes for a line break as a \u escape. encoding/json leaves
// such runes only inside strings (it writes U+2028 and U+2029 escaped
// already), where an escape means the same rune.
func escapeForYAML(j []byte) []byte {
	if !bytes.ContainsFunc(j, yamlRefuses) {
		return j
	}
	var b bytes.Buffer
	b.Grow(len(j) + 16)
	for len(j) > 0 {
		r, n := utf8.DecodeRune(j)
		if yamlRefuses(r) {
			fmt.Fprintf(&b, `\u%04x`, r)
		} else {
			b.Write(j[:n])
		}
		j = j[n:]
	}
	return b.Bytes()
}

// yamlRefuses says whether a YAML 1.1 reader refuses r raw in a document
// or reads it as a line break (NEL): DEL, the C1 controls, the byte order
// mark and the two noncharacters of the Basic Multilingual Plane.
func yamlRefuses(r rune) bool {
	return r >= 0x7f && r <= 0x9f || r == 0xfeff || r == 0xfffe || r == 0xffff
}
