package expr

import (
	"math"
	"unicode/utf8"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
)

// Measuring a call's work before it is made (callCosts). A value an
// expression builds may share its parts — cel.bind(a, [b, b], …) doubles
// what a walk reads with each level, for the cost of one list — so what
// a call would read is not the size of its arguments, and a walk that
// measured it to the end could itself take forever. Every walk here
// counts into a tally that stops at the limit: once the count is over,
// the walk returns, having read no more than the limit allows.

// A tally counts work up to a limit. Once over the limit it stays over,
// and add reports false, so that a walk stops.
type tally struct {
	n, limit uint64
}

// add counts n more; false once the count is over the limit.
func (t *tally) add(n uint64) bool {
	if t.n > t.limit || n > t.limit-t.n {
		t.n = t.limit + 1
		return false
	}
	t.n += n
	return true
}

// count is what the tally counted: at most limit+1, which means more than
// the limit.
func (t *tally) count() uint64 { return t.n }

// The units of cel-go's cost model, which the charges here keep: a call
// costs 1, making a list 10, and reading a string 0.1 a character.
const (
	costCall       = 1
	costListCreate = 10
	// bytesRead is how many characters or bytes cost 1 to read (compare,
	// scan); a byte copied into what a call makes costs 1.
	bytesRead  = 10
	bytesWrite = 1
)

// traversal is what reading n characters costs: 0.1 each, rounded up.
func traversal(n uint64) uint64 { return n/bytesRead + min(n%bytesRead, 1) }

// celSize is v's size as CEL's size() counts it (a string's code points,
// a list's elements, a map's entries), or 1 for a value without one, as
// cel-go's tracker counts it.
func celSize(v ref.Val) uint64 {
	if s, ok := v.(traits.Sizer); ok {
		if n, ok := s.Size().(types.Int); ok && n >= 0 {
			return uint64(n)
		}
	}
	return 1
}

// byteLen is the length in bytes of a string or bytes value, 0 of any
// other.
func byteLen(v ref.Val) uint64 {
	switch v := v.(type) {
	case types.String:
		return uint64(len(v))
	case types.Bytes:
		return uint64(len(v))
	}
	return 0
}

// runes is the number of code points of a string value, its length of a
// bytes value, 0 of any other.
func runes(v ref.Val) uint64 {
	if s, ok := v.(types.String); ok {
		return uint64(utf8.RuneCountInString(string(s)))
	}
	return byteLen(v)
}

// weigh counts into t what reading v whole costs: 1 for v and for each
// element, map key and map value in it, at every depth, and a string's or
// bytes' length divided by perUnit (bytesWrite where they are copied into
// what the call makes, bytesRead where they are only compared). It
// reports false once t is over.
func weigh(v ref.Val, t *tally, perUnit uint64) bool {
	if !t.add(1) {
		return false
	}
	switch v := v.(type) {
	case types.String, types.Bytes:
		n := byteLen(v)
		return t.add(n/perUnit + min(n%perUnit, 1))
	case *types.Optional:
		if v.HasValue() {
			return weigh(v.GetValue(), t, perUnit)
		}
	case traits.Mapper:
		for it := v.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			if !weigh(k, t, perUnit) || !weigh(v.Get(k), t, perUnit) {
				return false
			}
		}
	case traits.Lister:
		for it := v.Iterator(); it.HasNext() == types.True; {
			if !weigh(it.Next(), t, perUnit) {
				return false
			}
		}
	}
	return true
}

// weight is weigh of v into a tally of limit: what reading v costs, or
// limit+1 when it is more.
func weight(v ref.Val, limit, perUnit uint64) uint64 {
	t := &tally{limit: limit}
	weigh(v, t, perUnit)
	return t.count()
}

// inner is what the elements of l hold beyond themselves (weigh less 1
// each, read as compared), or limit+1 when it is more than limit: what
// comparing an element with an equal one reads besides the pair.
func inner(l traits.Lister, limit uint64) uint64 {
	n := celSize(l)
	t := &tally{limit: limit + n} // and 1 for each element, not counted
	for it := l.Iterator(); it.HasNext() == types.True; {
		if !weigh(it.Next(), t, bytesRead) {
			return limit + 1
		}
	}
	return t.count() - n
}

// comparing is what comparing each element of a with each of b costs at
// most: 1 a pair, and what the smaller of two compared elements holds
// (inner) — at most, over all pairs, each element of a against all that
// b's elements hold, or each of b against a's. It is limit+1 when it is
// more than limit.
func comparing(a, b traits.Lister, limit uint64) uint64 {
	n, m := celSize(a), celSize(b)
	pairs := mul(n, m)
	if pairs > limit {
		return limit + 1
	}
	deep := min(mul(m, inner(a, limit)), mul(n, inner(b, limit)))
	return min(pairs+min(deep, limit+1), limit+1)
}

// flattening counts into t the elements l.flatten(depth) visits: each of
// l's, and, to depth levels, those of each list among them. It reports
// false once t is over.
func flattening(l traits.Lister, depth int64, t *tally) bool {
	for it := l.Iterator(); it.HasNext() == types.True; {
		e := it.Next()
		if !t.add(1) {
			return false
		}
		if nested, ok := e.(traits.Lister); ok && depth > 0 && !flattening(nested, depth-1, t) {
			return false
		}
	}
	return true
}

// merging counts into t the entries a.merge(b) reads and writes — every
// entry of a and of b, 2 each — and, deep (a.deepMerge(b)), those of
// every two maps a and b hold under one key, which are merged in turn, at
// every depth. It reports false once t is over.
func merging(a, b traits.Mapper, deep bool, t *tally) bool {
	if !t.add(mul(2, celSize(a))) || !t.add(mul(2, celSize(b))) {
		return false
	}
	if !deep {
		return true
	}
	for it := b.Iterator(); it.HasNext() == types.True; {
		k := it.Next()
		old, found := a.Find(k)
		if !found {
			continue
		}
		ma, okA := old.(traits.Mapper)
		mb, okB := b.Get(k).(traits.Mapper)
		if okA && okB && !merging(ma, mb, true, t) {
			return false
		}
	}
	return true
}

// mul is a×b, or the largest uint64 when that overflows.
func mul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}
