package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// A cluster that does not answer is set aside: nothing is asked of it
// until a probe of its /readyz answers. One that answers probes but keeps
// failing requests — a proxy that holds writes open, an API server that
// times out under load — would come back at every probe and hold
// workers again, each up to a request's deadline; so each failure soon
// after it answered again sets it aside twice as long before it is
// probed, up to maxSetAside. One that stays up for stableAfter starts
// over.
const (
	stableAfter = time.Minute
	maxSetAside = 5 * time.Minute
)

// health is whether one cluster answers, as requests and probes found
// it: a breaker. Safe for concurrent use.
type health struct {
	mu      sync.Mutex
	down    error // nil: reachable as far as is known
	probing bool
	returns int       // times it answered again after it did not
	trips   int       // failures in a row, each soon after it answered again
	upSince time.Time // when it last answered again
}

// isDown says why the cluster is not reachable, or nil.
func (h *health) isDown() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.down
}

func (h *health) returned() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.returns
}

// fail records that a request found no answer, at now. start: it was up,
// and is to be probed after aside (interval, doubled for every failure
// in a row soon after answering again).
func (h *health) fail(err error, now time.Time, interval time.Duration) (start bool, aside time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.probing {
		h.down = err
		return false, 0
	}
	if h.returns > 0 && now.Sub(h.upSince) < stableAfter {
		h.trips++
	} else {
		h.trips = 1
	}
	aside = interval << min(h.trips-1, 16)
	aside = min(aside, maxSetAside)
	h.down = err
	if h.trips > 1 {
		times := "once"
		if h.trips > 2 {
			times = fmt.Sprintf("%d times in a row", h.trips-1)
		}
		h.down = fmt.Errorf("set aside for %s: it failed again within %s of answering, %s: %w", aside, stableAfter, times, err)
	}
	h.probing = true
	return true, aside
}

// probed records a probe's answer (err nil: it answered) at now; true:
// the cluster is up again.
func (h *health) probed(err error, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		h.down = err
		return false
	}
	h.down, h.probing = nil, false
	h.returns++
	h.upSince = now
	return true
}

// contain keeps a panic of a probe of cluster to the probe: the cluster
// stays down (a Failed request probes it again), the process goes on.
func (inv *Inventory) contain(ctx context.Context, cluster string) {
	if p := recover(); p != nil {
		klog.FromContext(ctx).Error(fmt.Errorf("panic: %v", p), "Probe of a cluster panicked", "cluster", cluster)
		inv.mu.RLock()
		c := inv.clusters[cluster]
		inv.mu.RUnlock()
		if c != nil {
			c.health.mu.Lock()
			c.health.probing = false
			c.health.mu.Unlock()
		}
	}
}
