package render

import (
	"fmt"
	"strings"
	"time"
)

// The Ready condition syncloop keeps on a trigger whose rule has a status,
// by the Kubernetes API conventions (metav1.Condition), so that
// `kubectl wait --for=condition=Ready` works on triggers.
const (
	ConditionReady = "Ready"

	ReasonAllResourcesReady = "AllResourcesReady"
	ReasonReconcileFailed   = "ReconcileFailed"
	// ReasonChildConflict: a child is not applied because an object
	// syncloop may not take over holds its name (ConflictError).
	ReasonChildConflict = "ChildConflict"
	// ReasonContended: another writer keeps changing fields of a child
	// the rule sets, and syncloop has stopped repairing them for a while
	// (ContendedError).
	ReasonContended = "Contended"
	// ReasonWaitingFor is followed by the resource id, capitalised:
	// WaitingForDb, WaitingForTeamConfig.
	ReasonWaitingFor = "WaitingFor"
	// ReasonWaitingForLookup is followed by the id of a required lookup
	// whose object is absent: WaitingForLookupDatabase.
	ReasonWaitingForLookup = "WaitingForLookup"
	// ReasonTearingDown: the trigger is being deleted, and an ordered
	// teardown deletes its children wave by wave.
	ReasonTearingDown = "TearingDown"

	// maxConditionMessage keeps a condition's message readable; the API
	// allows 32 KiB.
	maxConditionMessage = 1024
)

// Condition is the Ready condition of one reconcile, before it is merged
// into the trigger's conditions.
type Condition struct {
	Status  bool
	Reason  string
	Message string
}

// Readiness is the Ready condition this render earns: True with
// AllResourcesReady when every required lookup found its object and every
// wanted resource's children exist and are ready; otherwise False with
// WaitingForLookup<Id> naming the first required lookup whose object is
// absent, ClusterUnreachable naming the clusters children wait for,
// WaitingFor<Id> naming the first resource, in dependency order, that is
// not ready, and why, or — all else ready — RolloutPending naming the
// clusters a rollout by cluster has not reached yet.
func (rd *Rendered) Readiness() Condition {
	if len(rd.absent) > 0 {
		q := rd.absent[0]
		msg := fmt.Sprintf("lookup %q is required: %s", q.Lookup.ID, q.absence())
		if waiting := rd.Waiting(); len(waiting) > 0 {
			ids := make([]string, len(waiting))
			for i, st := range waiting {
				ids[i] = st.Resource.ID
			}
			msg += "; waiting: " + strings.Join(ids, ", ")
		}
		return Condition{Status: false, Reason: ReasonWaitingForLookup + camel(q.Lookup.ID), Message: msg}
	}
	if c, ok := rd.unreachableCondition(); ok {
		return c
	}
	wanted := 0
	var first *ResourceState
	var waiting []string
	for _, st := range rd.Resources {
		switch {
		case st.Excluded:
			continue
		case st.waits():
			waiting = append(waiting, st.Resource.ID)
		case !st.Ready && first == nil:
			first = st
		}
		wanted++
	}
	if first == nil && len(waiting) == 0 {
		if c, ok := rd.pendingCondition(); ok {
			return c
		}
		msg := fmt.Sprintf("all %d resources are ready", wanted)
		switch wanted {
		case 0:
			msg = "no resources to wait for"
		case 1:
			msg = "the resource is ready"
		}
		return Condition{Status: true, Reason: ReasonAllResourcesReady, Message: msg}
	}
	if first == nil { // cannot happen: a waiting resource waits for one not ready
		first = rd.Resources[0]
		for _, st := range rd.Resources {
			if st.waits() {
				first = st
				break
			}
		}
	}
	msg := fmt.Sprintf("resource %q is not ready: %s", first.Resource.ID, first.Why)
	if len(waiting) > 0 {
		msg += fmt.Sprintf("; waiting: %s", strings.Join(waiting, ", "))
	}
	return Condition{Status: false, Reason: ReasonWaitingFor + camel(first.Resource.ID), Message: msg}
}

// Failed is the Ready condition of a reconcile that failed with err:
// ChildConflict when all that failed were conflicts (ConflictError),
// Contended when all were children another writer keeps changing
// (ContendedError), ReconcileFailed otherwise.
func Failed(err error) Condition {
	switch {
	case OnlyConflicts(err):
		return Condition{Status: false, Reason: ReasonChildConflict, Message: err.Error()}
	case only[*ContendedError](err):
		return Condition{Status: false, Reason: ReasonContended, Message: err.Error()}
	}
	return Condition{Status: false, Reason: ReasonReconcileFailed, Message: err.Error()}
}

// TearingDown is the Ready condition of a trigger whose children an
// ordered teardown is deleting; msg says which wave.
func TearingDown(msg string) Condition {
	return Condition{Status: false, Reason: ReasonTearingDown, Message: msg}
}

// camel turns a resource id (a DNS-1123 label) into the CamelCase a
// condition reason allows: team-config → TeamConfig, db2 → Db2.
func camel(id string) string {
	var b strings.Builder
	for _, part := range strings.Split(id, "-") {
		if part == "" {
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]))
		b.WriteString(part[1:])
	}
	return b.String()
}

// Conditions returns the trigger's status.conditions with c set as the
// Ready condition: existing is what the trigger holds, rendered what the
// rule's status renders as conditions (either may be nil). Conditions of
// other types are kept, the rule's replacing the trigger's of the same
// type; syncloop's Ready replaces any other. lastTransitionTime is now
// when the status changes, and kept otherwise, so a reconcile that changes
// nothing writes nothing.
func (c Condition) Conditions(existing, rendered any, generation int64, now time.Time) []any {
	var out []any
	index := map[string]int{}
	set := func(cond map[string]any) {
		t, _ := cond["type"].(string)
		if i, ok := index[t]; ok && t != "" {
			out[i] = cond
			return
		}
		index[t] = len(out)
		out = append(out, cond)
	}
	for _, list := range []any{existing, rendered} {
		l, _ := list.([]any)
		for _, e := range l {
			if m, ok := e.(map[string]any); ok {
				set(m)
			}
		}
	}
	status := "False"
	if c.Status {
		status = "True"
	}
	msg := c.Message
	if len(msg) > maxConditionMessage {
		msg = strings.ToValidUTF8(msg[:maxConditionMessage-3], "") + "..."
	}
	ready := map[string]any{
		"type":               ConditionReady,
		"status":             status,
		"reason":             c.Reason,
		"message":            msg,
		"lastTransitionTime": now.UTC().Format(time.RFC3339),
	}
	if generation > 0 {
		ready["observedGeneration"] = generation
	}
	if i, ok := index[ConditionReady]; ok {
		if prev, _ := out[i].(map[string]any); prev["status"] == status {
			if t, ok := prev["lastTransitionTime"].(string); ok && t != "" {
				ready["lastTransitionTime"] = t
			}
		}
	}
	set(ready)
	return out
}
