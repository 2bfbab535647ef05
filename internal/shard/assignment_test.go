package shard

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/engine"
)

func digests(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = engine.TriggerDigest(cache.ObjectName{Namespace: "shop", Name: fmt.Sprintf("trigger-%d", i)})
	}
	return out
}

// TestViewFairShare: each member of a view owns about its share of the
// triggers: within ±40 % of N/3 at N = 300 (the bound), within
// ±3 % at N = 30,000.
func TestViewFairShare(t *testing.T) {
	v := newView([]string{"syncloop-7d9f8-abcde", "syncloop-7d9f8-fghij", "syncloop-7d9f8-klmno"})
	rule := hashString("copy")
	for _, tc := range []struct {
		n     int
		slack float64
	}{{300, 0.4}, {30000, 0.03}} {
		count := map[string]int{}
		for _, d := range digests(tc.n) {
			count[v.owner(rule, d)]++
		}
		for _, m := range v.names {
			share := float64(tc.n) / 3
			if got := float64(count[m]); got < share*(1-tc.slack) || got > share*(1+tc.slack) {
				t.Errorf("N=%d: %s owns %d, want %.0f ± %.0f %%", tc.n, m, count[m], share, tc.slack*100)
			}
		}
	}
}

// TestViewMovesOnlyWhatItMust: a member joining takes triggers only for
// itself; one leaving gives only its own away.
func TestViewMovesOnlyWhatItMust(t *testing.T) {
	two, three := newView([]string{"a", "b"}), newView([]string{"c", "b", "a"})
	rule := hashString("copy")
	moved := 0
	for _, d := range digests(3000) {
		before, after := two.owner(rule, d), three.owner(rule, d)
		if before != after {
			moved++
			if after != "c" {
				t.Fatalf("a trigger moved from %s to %s when c joined", before, after)
			}
		}
	}
	if moved < 800 || moved > 1200 {
		t.Errorf("%d of 3000 triggers moved to the new member, want about 1000", moved)
	}
}

// TestAssignmentExclusive: whatever views the members have published —
// agreeing, lagging, some none yet — and whatever a member is publishing,
// no trigger is owned by two members that see the same Leases; and once
// every member has published the same view, every trigger is owned by
// exactly one.
func TestAssignmentExclusive(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	ds := digests(400)
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 1))
		randomView := func() *view {
			var members []string
			for _, n := range names {
				if r.IntN(3) > 0 {
					members = append(members, n)
				}
			}
			if len(members) == 0 || r.IntN(6) == 0 {
				return nil
			}
			return newView(members)
		}
		published := map[string]*view{}
		for _, n := range names {
			published[n] = randomView()
		}
		var shards []*assignment
		for _, n := range names {
			mine := []*view{published[n]}
			if r.IntN(2) == 0 {
				mine = append(mine, randomView()) // publishing a new view
			}
			shards = append(shards, newAssignment(n, mine, published))
		}
		for _, d := range ds {
			owners := 0
			for _, a := range shards {
				if a.Owns("copy", d) {
					owners++
					// What a replica owns it keeps whole (engine.Shard.Keeps).
					if !a.Keeps("copy", d) {
						t.Fatalf("seed %d: %s owns trigger %x and does not keep it", seed, a.self, d)
					}
				}
			}
			if owners > 1 {
				t.Fatalf("seed %d: trigger %x owned by %d members; published %v", seed, d, owners, published)
			}
		}
	}

	agreed := newView(names)
	published := map[string]*view{}
	for _, n := range names {
		published[n] = agreed
	}
	for _, d := range ds {
		owners := 0
		for _, n := range names {
			if newAssignment(n, []*view{agreed}, published).Owns("copy", d) {
				owners++
			}
		}
		if owners != 1 {
			t.Fatalf("with every view agreed, trigger %x has %d owners", d, owners)
		}
	}
}

// TestAssignmentWhileLive: an assignment is not held while its replica's
// Lease is not current; what it owns does not change.
func TestAssignmentWhileLive(t *testing.T) {
	v := newView([]string{"a"})
	live := true
	a := newAssignment("a", []*view{v}, nil).while(func() bool { return live })
	d := digests(1)[0]
	if !a.Owns("r", d) || !a.Held() {
		t.Fatal("the only member does not own a trigger, or does not hold it")
	}
	live = false
	if a.Held() || !a.Owns("r", d) {
		t.Errorf("with the Lease not current: held %v, owns %v; want false, true", a.Held(), a.Owns("r", d))
	}
}

// TestAssignmentKeepsWithin: whenever an assignment says it keeps no
// trigger the one before did not, it keeps none; and it says so for the
// changes that only narrow what a replica keeps — a member joins, a
// handover to a bigger view ends — and not for one that widens it (a
// member leaves).
func TestAssignmentKeepsWithin(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	ds := digests(400)
	r := rand.New(rand.NewPCG(7, 1))
	randomViews := func() []*view {
		var vs []*view
		for range 1 + r.IntN(2) {
			var members []string
			for _, n := range names {
				if r.IntN(3) > 0 {
					members = append(members, n)
				}
			}
			if len(members) > 0 {
				vs = append(vs, newView(members))
			}
		}
		return vs
	}
	said := 0
	for range 3000 {
		then := newAssignment("a", randomViews(), nil)
		now := newAssignment("a", randomViews(), nil)
		if !now.KeepsWithin(then) {
			continue
		}
		said++
		for _, d := range ds {
			if now.Keeps("copy", d) && !then.Keeps("copy", d) {
				t.Fatalf("%s said to keep within %s, and keeps trigger %x it did not", now, then, d)
			}
		}
	}
	if said < 100 {
		t.Errorf("of 3000 random pairs, only %d were said to keep within: the test proves little", said)
	}

	ab, abc := newView([]string{"a", "b"}), newView([]string{"a", "b", "c"})
	cases := []struct {
		name      string
		now, then *assignment
		want      bool
	}{
		{"c joins", newAssignment("a", []*view{ab, abc}, nil), newAssignment("a", []*view{ab}, nil), true},
		{"the handover to c ends", newAssignment("a", []*view{abc}, nil), newAssignment("a", []*view{ab, abc}, nil), true},
		{"unchanged", newAssignment("a", []*view{ab}, nil), newAssignment("a", []*view{ab}, nil), true},
		{"c leaves", newAssignment("a", []*view{abc, ab}, nil), newAssignment("a", []*view{abc}, nil), false},
		{"the first share", newAssignment("a", []*view{ab}, nil), newAssignment("a", nil, nil), false},
		{"no share yet", newAssignment("a", nil, nil), newAssignment("a", []*view{ab}, nil), true},
		{"another member's", newAssignment("a", []*view{abc}, nil), newAssignment("b", []*view{ab}, nil), false},
	}
	for _, c := range cases {
		if got := c.now.KeepsWithin(c.then); got != c.want {
			t.Errorf("%s: KeepsWithin = %v, want %v", c.name, got, c.want)
		}
	}
}
