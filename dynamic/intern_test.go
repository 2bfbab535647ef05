package dynamic

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"unsafe"
)

func decode(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestInterner: two decoded objects share their keys, apiVersion, kind,
// namespaces and label values after interning, are otherwise unchanged,
// and long strings are left alone.
func TestInterner(t *testing.T) {
	const obj = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s","namespace":"shop",
		"labels":{"app":"web","team":"%s"},"ownerReferences":[{"apiVersion":"example.com/v1","kind":"App","name":"web"}]},
		"data":{"long":"%s"}}`
	long := fmt.Sprintf("%0100d", 7)
	a := decode(t, fmt.Sprintf(obj, "a", "blue", long))
	b := decode(t, fmt.Sprintf(obj, "b", "blue", long))
	want := decode(t, fmt.Sprintf(obj, "b", "blue", long))
	internObject(a)
	internObject(b)
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("interning changed the object:\n%v\nwant\n%v", b, want)
	}
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	key := func(m map[string]any, k string) string {
		for kk := range m {
			if kk == k {
				return kk
			}
		}
		t.Fatalf("no key %q", k)
		return ""
	}
	meta := func(m map[string]any) map[string]any { return m["metadata"].(map[string]any) }
	labels := func(m map[string]any) map[string]any { return meta(m)["labels"].(map[string]any) }
	owner := func(m map[string]any) map[string]any { return meta(m)["ownerReferences"].([]any)[0].(map[string]any) }
	for _, c := range []struct {
		what string
		x, y string
	}{
		{"top-level key", key(a, "metadata"), key(b, "metadata")},
		{"nested key", key(meta(a), "namespace"), key(meta(b), "namespace")},
		{"label key", key(labels(a), "team"), key(labels(b), "team")},
		{"key in a list", key(owner(a), "kind"), key(owner(b), "kind")},
		{"apiVersion", a["apiVersion"].(string), b["apiVersion"].(string)},
		{"kind in a list", owner(a)["kind"].(string), owner(b)["kind"].(string)},
		{"namespace", meta(a)["namespace"].(string), meta(b)["namespace"].(string)},
		{"label value", labels(a)["team"].(string), labels(b)["team"].(string)},
	} {
		if !same(c.x, c.y) {
			t.Errorf("%s %q not shared", c.what, c.x)
		}
	}
	if same(a["data"].(map[string]any)["long"].(string), b["data"].(map[string]any)["long"].(string)) {
		t.Error("a value longer than the limit was interned")
	}
}

// TestInternStaticKeys: the keys of an object converted from protobuf are
// the binary's constants already, so interning it replaces none of them
// (each replacement is a map write); those of a decoded object become the
// same constants.
func TestInternStaticKeys(t *testing.T) {
	child := benchChild()
	child.ManagedFields = nil // as the informers have it
	converted, ok := fastUnstructured(child)
	if !ok {
		t.Fatal("the child is not converted field by field")
	}
	decoded := decode(t, `{"metadata":{"name":"a","labels":{"app":"web"}},"data":{"k":"v"}}`)
	for what, m := range map[string]map[string]any{"converted": converted, "decoded": decoded} {
		internObject(m)
		for _, mm := range []map[string]any{m, m["metadata"].(map[string]any)} {
			for k := range mm {
				if c, ok := staticKeys[k]; ok && unsafe.StringData(c) != unsafe.StringData(k) {
					t.Errorf("%s: key %q is not the constant after interning", what, k)
				}
			}
		}
	}
}

// BenchmarkInternObject interns a child as the informers receive it from
// protobuf, converted field by field.
func BenchmarkInternObject(b *testing.B) {
	child := benchChild()
	child.ManagedFields = nil
	for b.Loop() {
		m, _ := fastUnstructured(child)
		internObject(m)
	}
}
