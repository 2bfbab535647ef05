package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"

	"github.com/syncloop/syncloop/dynamic"
)

// holds reports whether live holds every field of desired with an equal
// value: maps key by key (live may have more), lists element by element
// (same length), numbers by value whether int64 or float64. It is how a
// reconcile decides that an apply would change nothing.
func holds(live, desired any) bool {
	switch d := desired.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return false
		}
		for k, dv := range d {
			lv, ok := l[k]
			if !ok || !holds(lv, dv) {
				return false
			}
		}
		return true
	case []any:
		l, ok := live.([]any)
		if !ok || len(l) != len(d) {
			return false
		}
		for i := range d {
			if !holds(l[i], d[i]) {
				return false
			}
		}
		return true
	case int64:
		switch l := live.(type) {
		case int64:
			return l == d
		case float64:
			return l == float64(d)
		}
		return false
	case float64:
		switch l := live.(type) {
		case int64:
			return float64(l) == d
		case float64:
			return l == d
		}
		return false
	}
	return live == desired
}

// contentHash is a short hash of an object's content, for the
// applied-hash annotation: it changes when any desired field changes,
// including when one is removed — which holds cannot see.
func contentHash(obj map[string]any) string {
	bp := hashBuffers.Get().(*[]byte)
	defer hashBuffers.Put(bp)
	data, err := dynamic.AppendJSON((*bp)[:0], obj) // map keys sorted: canonical
	if err != nil {
		return ""
	}
	if cap(data) <= 64<<10 { // a huge object's buffer is not kept
		*bp = data
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// hashBuffers hold contentHash's encodings: hashed, then no longer needed.
var hashBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}
