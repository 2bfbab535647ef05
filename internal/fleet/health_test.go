package fleet

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestHealthSetsAsideWhatKeepsFailing: a cluster that answers its probe
// but fails again soon after is set aside twice as long each time, up to
// maxSetAside, and says so; one that stays up a while starts over.
func TestHealthSetsAsideWhatKeepsFailing(t *testing.T) {
	h := &health{}
	now := time.Unix(0, 0)
	interval := 2 * time.Second
	timeout := errors.New("context deadline exceeded")
	var asides []time.Duration
	for range 10 {
		start, aside := h.fail(timeout, now, interval)
		if !start {
			t.Fatal("a failure of a cluster that was up did not start a probe")
		}
		if again, _ := h.fail(timeout, now, interval); again {
			t.Fatal("a second failure while down started a second probe")
		}
		asides = append(asides, aside)
		now = now.Add(aside)
		if !h.probed(nil, now) || h.isDown() != nil {
			t.Fatal("an answered probe did not put the cluster back")
		}
		now = now.Add(time.Second) // fails again a second after it answered
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, maxSetAside, maxSetAside}
	for i := range want {
		if asides[i] != want[i] {
			t.Fatalf("set aside %v, want %v", asides, want)
		}
	}
	h.fail(timeout, now, interval)
	if err := h.isDown(); err == nil || !strings.Contains(err.Error(), "set aside for 5m0s") || !errors.Is(err, timeout) {
		t.Errorf("down = %v, want it set aside, saying why", err)
	}
	now = now.Add(time.Minute)
	h.probed(nil, now)
	if _, aside := h.fail(timeout, now.Add(stableAfter), interval); aside != interval {
		t.Errorf("a cluster up for %s set aside %s, want %s: it starts over", stableAfter, aside, interval)
	}
	if h.returned() != 11 {
		t.Errorf("returned %d times, want 11", h.returned())
	}
}
