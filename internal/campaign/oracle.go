package campaign

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/syncloop/syncloop/rules"
)

// The invariants, judged from the API server's audit log — what syncloop
// did, not what it says it did — against the workload's history.

// lagAllowed is how long syncloop may act on what it saw before a change:
// a delete of a child that was wanted throughout the lagAllowed before it
// was a delete of a desired child. Faults (an API server down for
// seconds, watches cut and relisted) make syncloop's view lag, never by
// this much.
const lagAllowed = 60 * time.Second

// checkOwnership: every write syncloop made in the workload's namespace
// went to a child — a ConfigMap under a child's name that was not an
// object of someone else's at the time — never to a trigger, the lookup
// source or a foreign object. A refused write (the create-only apply that
// found a foreign object: 409) is not a write.
func checkOwnership(writes []write, w *world) []string {
	var bad []string
	for _, wr := range writes {
		if wr.ns != workNS || !wr.ok() {
			continue
		}
		switch {
		case wr.resource == tallyStatus && wr.verb != "delete":
			// a trigger's status: the rule's to write
		case wr.resource != "configmaps":
			bad = append(bad, "a write to what syncloop makes none of here: "+wr.String())
		case wr.name == "source" || isTrigger(wr.name):
			bad = append(bad, "a write to an object syncloop reads: "+wr.String())
		case w.foreignAt(wr.name, wr.at):
			bad = append(bad, "a write to an object of someone else's: "+wr.String())
		}
	}
	return bad
}

// tallyStatus is the status subresource of the Tally triggers, as the
// audit log names it.
var tallyStatus = tallies.Resource + "." + tallies.Group + "/status"

func isTrigger(name string) bool {
	for _, t := range triggerNames {
		if name == t {
			return true
		}
	}
	return false
}

// triggerOf is the trigger a child written belongs to, from its name.
func triggerOf(child string) string {
	i := strings.LastIndexByte(child, '-')
	if i < 0 {
		return ""
	}
	return child[:i]
}

// checkOneWriter: the children of one trigger are never written by two
// incarnations in overlapping intervals — A, then B, then A, then B again
// would be two replicas both working on it (a handover that did not wait,
// two leaders). A trigger handed back (A, B, A) is allowed: the second
// writer may have given it up or died.
func checkOneWriter(writes []write) []string {
	runs := map[string][]string{} // by trigger: the writers, one entry per run
	at := map[string][]write{}
	for _, wr := range writes {
		if wr.ns != workNS || wr.resource != "configmaps" || !wr.ok() {
			continue
		}
		t := triggerOf(wr.name)
		r := runs[t]
		if len(r) == 0 || r[len(r)-1] != wr.user {
			runs[t] = append(r, wr.user)
			at[t] = append(at[t], wr)
		}
	}
	var bad []string
	for t, r := range runs {
		for i := 3; i < len(r); i++ {
			if r[i] == r[i-2] && r[i-1] == r[i-3] && r[i] != r[i-1] {
				bad = append(bad, fmt.Sprintf("trigger %s written by two incarnations in turns: %s, %s, %s, %s",
					t, at[t][i-3], at[t][i-2], at[t][i-1], at[t][i]))
				break
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// checkNoDesiredDeleted: every child syncloop deleted was, at some moment
// within lagAllowed before, not wanted by its trigger (that incarnation
// of it).
func checkNoDesiredDeleted(writes []write, w *world) []string {
	var bad []string
	for _, wr := range writes {
		if wr.ns != workNS || wr.resource != "configmaps" || wr.verb != "delete" || !wr.ok() || wr.object == nil {
			continue
		}
		owner := wr.object.GetLabels()[rules.LabelOwnerUID]
		if w.wantedThroughout(wr.name, owner, wr.at.Add(-lagAllowed), wr.at) {
			bad = append(bad, "a child wanted throughout the minute before was deleted: "+wr.String())
		}
	}
	return bad
}

// childWrites counts syncloop's successful writes of children.
func childWrites(writes []write) int {
	n := 0
	for _, wr := range writes {
		if wr.ns == workNS && wr.resource == "configmaps" && wr.verb != "delete" && wr.ok() {
			n++
		}
	}
	return n
}

// checkWritesBounded: syncloop writes a child once per change the history
// asks for (made, changed, drifted and repaired), plus a retry for each
// write the proxy failed or whose answer it lost; within slack for what
// the history cannot see (a rule's generation changing while a write of
// the old one was under way).
func checkWritesBounded(writes []write, w *world, faultsOnWrites int) (string, []string) {
	made, wanted := childWrites(writes), w.changes()
	bound := wanted + faultsOnWrites + wanted/20 + 5
	summary := fmt.Sprintf("%d child writes for %d changes and %d writes the proxy failed (bound %d)", made, wanted, faultsOnWrites, bound)
	if made > bound {
		return summary, []string{"more child writes than the changes ask for: " + summary}
	}
	return summary, nil
}
