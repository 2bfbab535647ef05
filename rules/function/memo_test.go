package function

import (
	"fmt"
	"testing"
)

// TestMemo: an answer is kept by key for the digest it was computed from,
// and the memo starts again empty past its bound.
func TestMemo(t *testing.T) {
	m := NewMemo(2, 1<<10)
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

// TestMemoBytes: answers as long as a call's output may be cannot pile
// up, one per trigger, past the memo's bytes: past them it starts again
// empty, an answer larger than all of them is not kept, and what it holds
// never exceeds them.
func TestMemoBytes(t *testing.T) {
	const maxBytes = 1 << 20
	m := NewMemo(100_000, maxBytes)
	big := make([]byte, 300<<10)
	for i := range 1000 {
		m.Put(fmt.Sprint("uid-", i), "digest", big)
		if m.bytes > maxBytes {
			t.Fatalf("after %d answers of 300 KiB the memo holds %d bytes, more than %d", i+1, m.bytes, maxBytes)
		}
	}
	if _, ok := m.Get("uid-999", "digest"); !ok {
		t.Error("the last answer was not kept")
	}
	m.Put("huge", "digest", make([]byte, maxBytes+1))
	if _, ok := m.Get("huge", "digest"); ok {
		t.Error("an answer larger than the memo was kept")
	}
	m.Put("uid-999", "digest", []byte("small")) // a key it holds: counted once
	sum := 0
	for k, e := range m.answers {
		sum += e.size(k)
	}
	if sum != m.bytes {
		t.Errorf("the memo counts %d bytes, holds %d", m.bytes, sum)
	}
}
