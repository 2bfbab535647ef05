package rollout

import (
	"testing"
	"time"
)

// TestRolloutChoice: which revision reconciles a trigger during a
// rollout: those moved (their digest below the threshold) and those
// created since it began are on the new one; a rollout complete puts
// every trigger on it, one rolled back none.
func TestRolloutChoice(t *testing.T) {
	t.Parallel()
	began := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	before, after := began.Add(-time.Hour), began.Add(time.Second)
	for _, c := range []struct {
		state   string
		digest  uint64
		created time.Time
		onNew   bool
	}{
		{Progressing, 10, before, true},
		{Progressing, 100, before, false},
		{Progressing, 100, began, false}, // there when it began, to the second
		{Progressing, 100, after, true},
		{Progressing, 100, time.Time{}, false}, // not cached: as if there
		{Halted, 10, before, true},
		{Halted, 100, before, false},
		{Complete, 100, before, true},
		{RolledBack, 10, before, false},
		{RolledBack, 100, after, false},
	} {
		rec := &Record{State: c.state, Threshold: 50, Started: began}
		if got := rec.Puts(Trigger{Digest: c.digest, Created: c.created}); got != c.onNew {
			t.Errorf("%s, digest %d, created %v: on the new revision %v, want %v", c.state, c.digest, c.created, got, c.onNew)
		}
	}
}
