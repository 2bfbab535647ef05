package rollout

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
)

// The states of a rollout (Record.State).
const (
	// Progressing: steps are under way.
	Progressing = "Progressing"
	// Complete: every trigger is on the new revision.
	Complete = "Complete"
	// Halted: a step failed, or the next would remove more children than
	// maxPrunes allows; nothing moves until the rule or its rollout
	// settings change.
	Halted = "Halted"
	// RolledBack: a step failed under onFailure: Rollback; every trigger
	// is on the revision rolled out from.
	RolledBack = "RolledBack"
	// Superseded: the rule changed again before the rollout ended; the
	// rollout to the newer revision took its triggers over.
	Superseded = "Superseded"
)

// Why a rollout halted or rolled back (Record.Reason).
const (
	ReasonStepFailed  = "StepFailed"
	ReasonPruneBudget = "PruneBudget"
	// ReasonPanic: the coordinator panicked; it decides nothing more
	// until the rule or its rollout settings change.
	ReasonPanic = "Panic"
)

// Record is where one rollout of a rule stands: what its store keeps, so
// that a restart, or a new leader, continues it. Which revision a trigger
// is on follows from it alone: a trigger is on the new revision when the
// digest of its key salted with the rule's name (Digest) is below
// Threshold, or when it was created after Started — the same answer on
// every replica, at no cost per child.
type Record struct {
	// From and To are the hashes of the revisions rolled out from and to.
	From  string `json:"from"`
	To    string `json:"to"`
	State string `json:"state"`
	// Step is the step under way (0: none yet); Steps how many there
	// are, as far as the triggers there now say.
	Step  int `json:"step"`
	Steps int `json:"steps"`
	// Threshold bounds the digests of the triggers moved so far;
	// StepFrom is where the step under way began.
	Threshold uint64 `json:"threshold,string"`
	StepFrom  uint64 `json:"stepFrom,string"`
	// Started is when the rollout began (to the second: as creation
	// times are); triggers created after it are on the new revision.
	Started     time.Time `json:"started"`
	StepStarted time.Time `json:"stepStarted"`
	// Moved of Total triggers (those there when it began) are on the new
	// revision.
	Moved int `json:"moved"`
	Total int `json:"total"`
	// Children is how many children the rule had when the rollout began;
	// Pruned how many its steps have removed (as rendered before each).
	Children int `json:"children"`
	Pruned   int `json:"pruned"`
	// Reason and Message say why it halted or rolled back.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// active reports whether the rollout still decides which revision
// triggers are on step by step.
func (r *Record) active() bool {
	return r.State == Progressing || r.State == Halted
}

// Unfinished reports whether the record still splits the rule's triggers
// between its two revisions — under way, halted or rolled back — so that a
// restart resumes it and the revision it moves from must be kept.
func (r *Record) Unfinished() bool { return r.active() || r.State == RolledBack }

// Puts reports whether the record puts t on the new revision.
func (r *Record) Puts(t Trigger) bool {
	switch r.State {
	case Complete:
		return true
	case RolledBack:
		return false
	}
	return t.Digest < r.Threshold || !t.existing(r.Started)
}

// HeldFrom says why the record, a rollout under settings s, keeps its new
// revision out of cluster c for now: "" when s does not step by cluster,
// once the rollout has reached c, or once it has ended. Before it begins
// (no state) every cluster waits.
func (r *Record) HeldFrom(ctx context.Context, s rules.Rollout, c rules.Cluster) string {
	switch {
	case !s.ByCluster():
		return ""
	case r.State == Complete, r.State == RolledBack, r.State == Superseded:
		return ""
	}
	step := s.ClusterStep(ctx, c)
	if step < r.Step {
		return ""
	}
	return fmt.Sprintf("revision %s reaches it at step %d of %d", Short(r.To), step+1, len(s.Clusters)+1)
}

// Trigger is a cached trigger as a rollout sees it: its key, its rollout
// digest and when it was created (zero: not cached).
type Trigger struct {
	Key     cache.ObjectName
	Digest  uint64
	Created time.Time
}

// existing reports whether t was there when the rollout began (started):
// the triggers its steps move. Those created since are on the new
// revision from the start.
func (t Trigger) existing(started time.Time) bool { return !t.Created.After(started) }

// Digest orders a rule's triggers for its rollouts: the same order for
// every rollout of the rule (a rollout superseded mid-way continues with
// the triggers it had moved), another for another rule.
func Digest(rule string, key cache.ObjectName) uint64 {
	sum := sha256.Sum256([]byte(rule + "\x00" + key.String()))
	return binary.BigEndian.Uint64(sum[:8])
}

// Store keeps rollouts where a restarted syncloop finds them (the manager
// keeps them on the rule's revision objects) and says each transition
// where the user looks (an Event on the revision).
type Store interface {
	// Resume returns the rollout of r recorded or to begin — a record
	// whose State is empty begins one, from its Threshold and Started if
	// set — and the revision it rolls out from, compiled; nil, nil when r
	// has none (its revision is the one recorded in force, or the first).
	Resume(ctx context.Context, r *rules.Rule) (*Record, *rules.Rule, error)
	// Record keeps rec as r's rollout and, when reason is set, says so:
	// eventType is Normal or Warning.
	Record(ctx context.Context, r *rules.Rule, rec Record, eventType, reason, message string)
	// Fetch reads the rollout recorded for r now (nil: none): how the
	// replicas of a sharded group follow the one that steps the rollout.
	Fetch(ctx context.Context, r *rules.Rule) (*Record, error)
}

// Status is one rule's rollout as the engine runs it, for metrics and
// /readyz.
type Status struct {
	Rule string
	Record
	// OnFrom and OnTo count the triggers in the cache on each revision.
	OnFrom, OnTo int
	// ByCluster: the rollout steps by cluster; Reached are the clusters
	// its steps so far have brought the new revision to.
	ByCluster bool
	Reached   []string
	// Healthy of Judging triggers of the step under way are healthy as
	// this replica last judged them; Judging is 0 on a replica that does
	// not step the rollout (a follower of a sharded group).
	Healthy, Judging int
}

// Plan is what a coordinator is made with: the revision rolled out from
// and the record to begin or continue.
type Plan struct {
	From *rules.Rule
	Rec  Record
}

// Health is one trigger's last reconcile under the new revision: OK when
// it succeeded and every child is ready; Why, when not.
type Health struct {
	OK  bool
	Why string
}
