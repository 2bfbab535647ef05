package shard

import (
	"slices"
	"strings"

	"github.com/syncloop/syncloop/engine"
)

// A view is a set of shard members, sorted: the membership one replica
// works under. Every trigger belongs to exactly one member of a view, by
// rendezvous (highest random weight) hashing, so that adding or removing a
// member moves only the triggers it gains or had.
type view struct {
	names  []string
	hashes []uint64
}

func newView(names []string) *view {
	v := &view{names: slices.Clone(names)}
	slices.Sort(v.names)
	v.names = slices.Compact(v.names)
	for _, n := range v.names {
		v.hashes = append(v.hashes, mix(hashString(n)))
	}
	return v
}

// parseView reads a view as written in a Lease's annotation; "" is no view.
func parseView(s string) *view {
	if s == "" {
		return nil
	}
	return newView(strings.Split(s, ","))
}

func (v *view) String() string {
	if v == nil {
		return ""
	}
	return strings.Join(v.names, ",")
}

// size is how many members v has.
func (v *view) size() int {
	if v == nil {
		return 0
	}
	return len(v.names)
}

func (v *view) equal(w *view) bool {
	if v == nil || w == nil {
		return v == w
	}
	return slices.Equal(v.names, w.names)
}

// owner is the member of v that owns the trigger of rule (its hash) whose
// key has digest d; "" when v is empty.
func (v *view) owner(rule, d uint64) string {
	best, owner := uint64(0), ""
	x := d ^ rule
	for i, h := range v.hashes {
		if s := mix(x ^ h); owner == "" || s > best {
			best, owner = s, v.names[i]
		}
	}
	return owner
}

// hashString is FNV-1a.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is MurmurHash3's 64-bit finalizer: every input bit changes every
// output bit with probability one half.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb53a185e4e63
	x ^= x >> 33
	return x
}

// assignment is the triggers one replica may work on (engine.Shard): those
// it owns under every view it has published or is publishing, and that no
// other member owns under the view that member has published. While views
// disagree — a member has not yet seen a change, or has not yet drained
// what it loses — a trigger two views give to two members is worked on by
// neither; once they agree, by its owner.
type assignment struct {
	self  string
	views []*claimed // distinct views, each with the members that claim by it
	live  func() bool
}

// while makes a held only while live reports true (this replica's Lease
// renewed lately).
func (a *assignment) while(live func() bool) *assignment {
	a.live = live
	return a
}

// Held implements engine.Shard.
func (a *assignment) Held() bool { return a.live == nil || a.live() }

// claimed is a view and who works under it: this replica (mine) and other
// members whose published view it is.
type claimed struct {
	v        *view
	mine     bool
	claimers map[string]bool
}

// newAssignment is self's assignment when it works under mine (all of
// them; none: it owns nothing) and other members have published others
// (member → view; a nil view claims nothing).
func newAssignment(self string, mine []*view, others map[string]*view) *assignment {
	a := &assignment{self: self}
	find := func(v *view) *claimed {
		for _, c := range a.views {
			if c.v.equal(v) {
				return c
			}
		}
		c := &claimed{v: v, claimers: map[string]bool{}}
		a.views = append(a.views, c)
		return c
	}
	for _, v := range mine {
		if v == nil {
			return &assignment{self: self} // no view yet: nothing
		}
		find(v).mine = true
	}
	for member, v := range others {
		if v != nil && member != self {
			find(v).claimers[member] = true
		}
	}
	return a
}

// Owns implements engine.Shard.
func (a *assignment) Owns(rule string, d uint64) bool {
	rh := hashString(rule)
	mine := false
	for _, c := range a.views {
		o := c.v.owner(rh, d)
		if c.mine {
			if o != a.self {
				return false
			}
			mine = true
		}
		if o != a.self && c.claimers[o] {
			return false
		}
	}
	return mine
}

// String identifies the assignment, for telling whether it changed.
func (a *assignment) String() string {
	parts := make([]string, 0, len(a.views))
	for _, c := range a.views {
		claimers := make([]string, 0, len(c.claimers))
		for m := range c.claimers {
			claimers = append(claimers, m)
		}
		slices.Sort(claimers)
		p := "[" + c.v.String() + "]" + strings.Join(claimers, ",")
		if c.mine {
			p = "mine" + p
		}
		parts = append(parts, p)
	}
	slices.Sort(parts)
	return strings.Join(parts, ";")
}

// Pending implements engine.Shard: a replica that works under
// no view yet owns nothing, and a later assignment will say what it owns.
func (a *assignment) Pending() bool {
	for _, c := range a.views {
		if c.mine {
			return false
		}
	}
	return true
}

// Keeps implements engine.Shard: whether a view this replica works
// under gives it the trigger of rule with digest d, whether or not another
// member still claims it by an older view — what it owns once the views
// agree, every trigger it owns now among them. A replica keeps such
// triggers whole in its caches, so that a handover's end does not make it
// list them again.
func (a *assignment) Keeps(rule string, d uint64) bool {
	rh := hashString(rule)
	for _, c := range a.views {
		if c.mine && c.v.owner(rh, d) == a.self {
			return true
		}
	}
	return false
}

// KeepsWithin implements engine.Shard: a keeps no trigger that then,
// self's assignment too, did not keep. Each view a works under that gives
// self anything must have a view then worked under among its members,
// self one of them: a member added to a view only takes triggers away
// from the others (rendezvous hashing), so self keeps no more under it.
func (a *assignment) KeepsWithin(then engine.Shard) bool {
	t, ok := then.(*assignment)
	if !ok || t.self != a.self {
		return false
	}
	for _, c := range a.views {
		if !c.mine || !c.v.has(a.self) {
			continue // gives self nothing
		}
		if !slices.ContainsFunc(t.views, func(tc *claimed) bool { return tc.mine && tc.v.has(a.self) && tc.v.within(c.v) }) {
			return false
		}
	}
	return true
}

// has reports whether member is one of v's.
func (v *view) has(member string) bool {
	_, found := slices.BinarySearch(v.names, member)
	return found
}

// within reports whether every member of v is one of w's.
func (v *view) within(w *view) bool {
	for _, n := range v.names {
		if !w.has(n) {
			return false
		}
	}
	return true
}
