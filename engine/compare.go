package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
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

// Difference is the path of the first field of desired, in key order,
// that live does not hold as holds decides (".spec.replicas",
// ".spec.ports[0]"); "" when live holds them all, "." when they differ
// at the top. Only a mismatch pays for the path.
func Difference(live, desired any) string {
	if holds(live, desired) {
		return ""
	}
	switch d := desired.(type) {
	case map[string]any:
		if l, ok := live.(map[string]any); ok {
			keys := make([]string, 0, len(d))
			for k := range d {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if lv, ok := l[k]; !ok || !holds(lv, d[k]) {
					return "." + k + below(lv, d[k])
				}
			}
		}
	case []any:
		if l, ok := live.([]any); ok && len(l) == len(d) {
			for i := range d {
				if !holds(l[i], d[i]) {
					return fmt.Sprintf("[%d]", i) + below(l[i], d[i])
				}
			}
		}
	}
	return "."
}

// Drift says how a live child differs from desired, as a reconcile
// decides whether to apply it, without that reconcile's memory of its own
// writes (a trace's question): "" when in sync — it carries the hash of
// desired's content and either holds every desired field or was last
// written by manager (a field the API server rewrites, such as a
// Secret's stringData, then differs harmlessly) — otherwise what differs.
func Drift(live *unstructured.Unstructured, desired map[string]any, manager string) string {
	if rules.Annotation(live, rules.AnnotationAppliedHash) != contentHash(desired) {
		return "applied from another version of the rule"
	}
	path := Difference(live.Object, desired)
	if path == "" || lastWriter(live) == manager {
		return ""
	}
	return strings.TrimPrefix(path, ".") + " differs from the rule"
}

// lastWriter is the field manager whose entry is the newest; "" when two
// share the newest time.
func lastWriter(obj *unstructured.Unstructured) string {
	var last metav1.Time
	writer := ""
	for _, mf := range obj.GetManagedFields() {
		if mf.Time == nil {
			continue
		}
		switch {
		case mf.Time.After(last.Time):
			last, writer = *mf.Time, mf.Manager
		case mf.Time.Equal(&last) && mf.Manager != writer:
			writer = ""
		}
	}
	return writer
}

// below is Difference's path under a field that differs.
func below(live, desired any) string {
	if p := Difference(live, desired); p != "." {
		return p
	}
	return ""
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
