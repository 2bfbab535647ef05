package webhook

import "sync"

// Bounds of the reviews served at once, whoever sends them.
const (
	// maxReviewBytes bounds a review's body. The API server sends a
	// review per object it reads or writes in a version other than the
	// stored one — the storage of each version decodes what it reads one
	// object at a time, so a LIST makes a review per object, not one of
	// the list (bench/RESULTS.md: 8,020 reviews of one object each). The
	// largest object it can hand over is bounded by its own limits: a
	// write's body is at most 3 MiB (kube-apiserver's
	// MaxRequestBodyBytes), a JSON patch copies at most 3 MiB more
	// (JSONPatchMaxCopyBytes) onto an object etcd held (1.5 MiB by
	// default), about 7.5 MiB; twice that leaves room for an etcd whose
	// limit was raised.
	maxReviewBytes = 16 << 20
	// maxReviews bounds the reviews in flight: one takes 0.04 ms at p50
	// (bench/RESULTS.md), so a legitimate API server never has nearly as
	// many waiting on one replica; beyond it a review is answered 429.
	maxReviews = 32
	// reviewMemory bounds what the reviews in flight are charged
	// together (charge): a quarter of the chart's memory limit.
	reviewMemory = 128 << 20
)

// gate admits the reviews served at once: at most maxReviews of them,
// whose charges add up to at most budget bytes. A review that does not
// fit is refused at once, never queued: what waits holds memory too.
type gate struct {
	mu         sync.Mutex
	reviews    int
	charged    int64
	maxReviews int
	budget     int64
}

// ticket is one admitted review's share of its gate. Its holder must
// call leave once the review is answered.
type ticket struct {
	g       *gate
	charged int64
}

// enter admits a review charged n bytes, or reports that it does not
// fit now.
func (g *gate) enter(n int64) (*ticket, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reviews >= g.maxReviews || g.charged+n > g.budget {
		return nil, false
	}
	g.reviews++
	g.charged += n
	return &ticket{g: g, charged: n}, true
}

// grow charges the review n bytes more, or reports that they do not fit
// now; the charge is then as it was.
func (t *ticket) grow(n int64) bool {
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	if t.g.charged+n > t.g.budget {
		return false
	}
	t.g.charged += n
	t.charged += n
	return true
}

// leave gives the review's share back.
func (t *ticket) leave() {
	t.g.mu.Lock()
	defer t.g.mu.Unlock()
	t.g.reviews--
	t.g.charged -= t.charged
	t.charged = 0
}

// fits reports whether a review charged n could ever be admitted.
func (g *gate) fits(n int64) bool { return n <= g.budget }
