package function

import "sync"

// Memo keeps a function's answers by key (a trigger's uid) while what
// they were computed from is unchanged (its digest): a function that
// answers from its input alone need not be called again for the same
// input. It holds at most max answers; past that it starts again empty.
type Memo struct {
	mu      sync.Mutex
	max     int
	answers map[string]memoEntry
}

type memoEntry struct {
	digest string
	out    []byte
}

// NewMemo returns an empty Memo of at most max answers.
func NewMemo(max int) *Memo {
	return &Memo{max: max, answers: map[string]memoEntry{}}
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

// Put keeps out as key's answer, computed from digest.
func (m *Memo) Put(key, digest string, out []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.answers[key]; !ok && len(m.answers) >= m.max {
		clear(m.answers)
	}
	m.answers[key] = memoEntry{digest: digest, out: out}
}
