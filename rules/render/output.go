package render

import (
	"fmt"

	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/syncloop/syncloop/rules/expr"
)

// What a function answers is outside data, bounded before it is decoded:
// its size by the call (function.Limits.Output), its nesting and what its
// values will hold here. It is measured first, in one pass that makes
// nothing, and what decoding it takes is charged to the trigger's render
// budget (MaxRenderedBytes, the one its templates spend), so that an
// answer the budget cannot hold — 16 MiB of [[],[],…] takes some 360 MB to
// decode —
// is refused before a value of it is made, whatever its shape.

// MaxOutputDepth bounds how deeply a function's answer nests its maps and
// lists, as a rule's own documents are bounded.
const MaxOutputDepth = 100

// decodeOverhead is what decoding takes over what the values hold in the
// end, as the budget counts them (expr.Shape.Size): lists and maps are
// grown as they are read. Measured with sigs.k8s.io/json (the API
// machinery's decoder), the peak heap of a decode is 1.1 to 2 times the
// shape's size, most for lists of small values.
const decodeOverhead = 2

// decodeJSON decodes data, a function's answer, into v as the API
// machinery does (integers int64) once it has charged b for it: its bytes
// and overhead times its shape. An answer nested deeper than
// MaxOutputDepth or that b cannot hold is refused, wrapping
// expr.ErrTooLarge, before anything is decoded. b may be nil: no budget,
// the depth still bounded.
func decodeJSON(data []byte, b *expr.Budget, v any) error {
	shape, err := measureJSON(data)
	if err != nil {
		return err
	}
	cost := int64(len(data)) + decodeOverhead*shape.Size()
	if err := b.Spend(cost); err != nil {
		return fmt.Errorf("%d bytes of JSON holding %s would take %d MiB to decode: %w", len(data), shape, cost>>20, err)
	}
	return utiljson.Unmarshal(data, v)
}

// measureJSON counts what the JSON data holds (expr.Shape) without
// decoding it: at least what decoding it makes, and more only where an
// object names a key twice. It fails, wrapping expr.ErrTooLarge, past
// MaxOutputDepth. Data that is not JSON is counted as far as it reads;
// the decoder refuses it whole before it makes anything.
func measureJSON(data []byte) (expr.Shape, error) {
	var s expr.Shape
	var inObject [MaxOutputDepth + 1]bool // of each open container; [0] is the top
	depth, key := 0, false                // key: the next string is an object's key
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ':':
		case c == ',':
			key = inObject[depth]
		case c == '}' || c == ']':
			depth = max(depth-1, 0)
			key = false
		case key && c == '"':
			end, n := scanString(data, i)
			s.Entries++
			s.Bytes += n
			i, key = end-1, false
		default:
			s.Values++
			if depth > 0 && !inObject[depth] {
				s.Elems++
			}
			switch c {
			case '{', '[':
				if depth == MaxOutputDepth {
					return s, fmt.Errorf("%w: nested more than %d levels deep", expr.ErrTooLarge, MaxOutputDepth)
				}
				depth++
				inObject[depth], key = c == '{', c == '{'
				if c == '{' {
					s.Maps++
				} else {
					s.Lists++
				}
			case '"':
				end, n := scanString(data, i)
				s.Bytes += n
				i = end - 1
			default: // a number, true, false or null: to the next delimiter
				for i+1 < len(data) && !delimiter(data[i+1]) {
					i++
				}
			}
		}
	}
	return s, nil
}

// scanString reads the string that opens at data[i]: it returns where it
// ends (after its closing quote, or the end of data) and the most bytes
// it decodes to — a byte of invalid UTF-8 becomes U+FFFD, three bytes;
// an escape is never longer decoded than written.
func scanString(data []byte, i int) (end int, n int64) {
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return j + 1, n
		case c == '\\':
			j++
			n++
		case c >= 0x80:
			n += 3
		default:
			n++
		}
	}
	return len(data), n
}

// delimiter reports whether c ends a number or a literal.
func delimiter(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ':', ']', '}', '[', '{', '"':
		return true
	}
	return false
}
