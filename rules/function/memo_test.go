package function

import "testing"

// TestMemo: an answer is kept by key for the digest it was computed from,
// and the memo starts again empty past its bound.
func TestMemo(t *testing.T) {
	m := NewMemo(2)
	m.Put("a", "d1", []byte("A"))
	if out, ok := m.Get("a", "d1"); !ok || string(out) != "A" {
		t.Errorf("Get(a, d1) = %q, %v: want A", out, ok)
	}
	if _, ok := m.Get("a", "d2"); ok {
		t.Error("Get(a, d2) found an answer computed from d1")
	}
	m.Put("b", "d1", []byte("B"))
	m.Put("a", "d2", []byte("A2")) // a key it holds: no room needed
	if out, ok := m.Get("b", "d1"); !ok || string(out) != "B" {
		t.Errorf("Get(b) = %q, %v: want B kept", out, ok)
	}
	m.Put("c", "d1", []byte("C")) // a third key: past the bound
	if _, ok := m.Get("b", "d1"); ok {
		t.Error("b kept past the bound of 2")
	}
	if out, ok := m.Get("c", "d1"); !ok || string(out) != "C" {
		t.Errorf("Get(c) = %q, %v: want C", out, ok)
	}
}
