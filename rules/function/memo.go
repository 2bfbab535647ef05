package function

import "sync"

// Memo keeps a function's answers by key (a trigger's uid) while what
// they were computed from is unchanged (its digest): a function that
// answers from its input alone need not be called again for the same
// input. It holds at most max answers of at most maxBytes in all (keys
// and digests counted); past either it starts again empty. An answer
// larger than maxBytes alone is not kept.
type Memo struct {
	mu              sync.Mutex
	max             int
	maxBytes, bytes int
	answers         map[string]memoEntry
}

type memoEntry struct {
	digest string
	out    []byte
}

func (e memoEntry) size(key string) int { return len(key) + len(e.digest) + len(e.out) }

// NewMemo returns an empty Memo of at most max answers and maxBytes.
func NewMemo(max, maxBytes int) *Memo {
	return &Memo{max: max, maxBytes: maxBytes, answers: map[string]memoEntry{}}
}

// Get returns the answer kept for key, if it was computed from digest.
func (m *Memo) Get(key, digest string) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.answers[key]
	if !ok || e.digest != digest {
		return nil, false
	}
	return e.out, true
}

// Put keeps out as key's answer, computed from digest. The Memo holds
// out from then on: the caller must not change it.
func (m *Memo) Put(key, digest string, out []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := memoEntry{digest: digest, out: out}
	if old, ok := m.answers[key]; ok {
		delete(m.answers, key)
		m.bytes -= old.size(key)
	}
	switch size := e.size(key); {
	case size > m.maxBytes:
		return
	case len(m.answers) >= m.max || m.bytes+size > m.maxBytes:
		clear(m.answers)
		m.bytes = 0
	}
	m.answers[key] = e
	m.bytes += e.size(key)
}
