package campaign

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOweMissing: a kind of fault that has not happened is owed and
// happens at the next request that can meet it, once; a kind that has
// happened, or has no probability, is not owed.
func TestOweMissing(t *testing.T) {
	p := &proxy{faults: Faults{ResetBefore: 1e-12, ServerError: 1e-12}, rng: rand.New(rand.NewPCG(1, 2)),
		counts: map[string]int{"server-error": 1}}
	p.on.Store(true)
	p.oweMissing()
	if !p.owed["reset-before"] || p.owed["server-error"] || p.owed["too-many-requests"] || len(p.owed) != 1 {
		t.Fatalf("owed %v, want reset-before only", p.owed)
	}
	if !p.draw(p.faults.ResetBefore, "reset-before", true) {
		t.Fatal("an owed reset-before did not happen")
	}
	if p.draw(p.faults.ResetBefore, "reset-before", true) {
		t.Fatal("a reset-before happened twice at a probability of 1e-12")
	}
	if p.counts["reset-before"] != 1 || p.counts["reset-before/write"] != 1 {
		t.Errorf("counts %v, want one reset-before, on a write", p.counts)
	}
}

// TestEvidence: a campaign that did not converge shows, of each replica's
// log, the lines naming what differs and those of the shard group.
func TestEvidence(t *testing.T) {
	dir := t.TempDir()
	log := "I1 loop.go] \"Rule running\" rule=\"tally\"\n" +
		"I2 reconcile.go] \"Applied\" object=\"campaign/tally-y1-a\"\n" +
		"I3 shard.go] \"Shard members changed: handed over\"\n" +
		"I4 reconcile.go] \"Applied\" object=\"campaign/tally-y2-a\"\n" +
		"I5 status.go] \"Status written\" trigger=\"campaign/y1\"\n"
	if err := os.WriteFile(filepath.Join(dir, "r0-1.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	rs := &replicas{logDir: dir}
	got := strings.Join(rs.evidence([]string{"tally-y1-a missing", "campaign/y1: status.note is n70, want n28"}), "\n")
	want := "r0-1.log: I2 reconcile.go] \"Applied\" object=\"campaign/tally-y1-a\"\n" +
		"r0-1.log: I3 shard.go] \"Shard members changed: handed over\"\n" +
		"r0-1.log: I5 status.go] \"Status written\" trigger=\"campaign/y1\""
	if got != want {
		t.Errorf("evidence:\n%s\nwant\n%s", got, want)
	}
}
