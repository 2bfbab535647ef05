package dynamic

import (
	"unique"
	"unsafe"
)

// maxInternLen: longer strings are left alone (they rarely repeat).
const maxInternLen = 64

// intern returns the shared copy of s. Interning makes the objects in the
// informer caches share one copy of the strings they repeat. A decoded object holds its own copy of every map key
// ("metadata", "name", "labels", each label key …) and of values such as
// its apiVersion and kind; over thousands of cached objects those copies
// are a large part of the cache.
//
// It uses the unique package, whose table holds its entries weakly: a
// string no cached object uses any more leaves the table at a later garbage
// collection, so the unique values among those interned (UIDs in labels)
// cost nothing once their objects are gone. Safe for concurrent use.
func intern(s string) string {
	if len(s) > maxInternLen {
		return s
	}
	return unique.Make(s).Value()
}

// internedValues are the keys whose string values repeat across objects.
var internedValues = map[string]bool{"apiVersion": true, "kind": true, "namespace": true}

// internObject interns, in place, the keys of m and of every map and list
// within, the values of internedValues' keys, and label values. Map keys are
// replaced without growing the map: assigning to an existing string key
// stores the new key.
func internObject(m map[string]any) {
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			if k == "labels" {
				internValues(v)
			}
			internObject(v)
		case []any:
			internList(v)
		case string:
			if internedValues[k] {
				m[k] = intern(v)
			}
		}
		if c := intern(k); unsafe.StringData(c) != unsafe.StringData(k) {
			m[c] = m[k]
		}
	}
}

func internList(l []any) {
	for _, v := range l {
		switch v := v.(type) {
		case map[string]any:
			internObject(v)
		case []any:
			internList(v)
		}
	}
}

// internValues interns the string values of m (labels: often shared by many
// objects — an app name, a team, syncloop's managed-by and rule), except
// UIDs, which are unique by construction: interning them only costs.
func internValues(m map[string]any) {
	for k, v := range m {
		if s, ok := v.(string); ok && !isUID(s) {
			m[k] = intern(s)
		}
	}
}

// isUID reports whether s has the form of a UID (8-4-4-4-12 hex digits).
func isUID(s string) bool {
	return len(s) == 36 && s[8] == '-' && s[13] == '-' && s[18] == '-' && s[23] == '-'
}
