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

// staticKeys maps the keys most objects have to string constants of this
// binary, which the field-by-field conversion of protobuf objects (typed.go)
// and the syncloop labels and annotations use too: the linker keeps one
// copy of each constant, so a key already pointing at it stays as it is,
// and a decoded copy of it is replaced by it without asking the unique
// table (a hash and a lookup under its locks, for every key of every
// event's object).
var staticKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{
		"apiVersion", "kind", "metadata", "spec", "status", "data", "binaryData", "stringData", "type", "immutable",
		"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
		"creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
		"labels", "annotations", "ownerReferences", "finalizers", "managedFields",
		"controller", "blockOwnerDeletion", "conditions", "observedGeneration",
		"manager", "operation", "time", "fieldsType", "fieldsV1", "subresource",
	} {
		m[k] = k
	}
	return m
}()

// internKey is the shared copy of a map key: its constant (staticKeys)
// or its interned copy.
func internKey(k string) string {
	if c, ok := staticKeys[k]; ok {
		return c
	}
	return intern(k)
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
		if c := internKey(k); unsafe.StringData(c) != unsafe.StringData(k) {
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
