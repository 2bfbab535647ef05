package rules

import (
	"slices"

	"go.yaml.in/yaml/v3"
)

// The rule's function (spec.function): code that computes the trigger's
// children and status, as a Metacontroller sync hook does. It is a
// resource of the rule — id SyncResourceID, after those in
// spec.resources — whose function speaks the sync hook protocol.

// decodeRuleFunction decodes spec.function (n) into the resource it is,
// the index-th of the rule's.
func (d *decoder) decodeRuleFunction(n *yaml.Node, index int, ids []string, docVal any) *Resource {
	const field = "spec.function"
	if slices.Contains(ids, SyncResourceID) {
		d.errorf(n, field, "a resource has the id %q, which the rule's function takes: rename it", SyncResourceID)
		return nil
	}
	errsBefore := len(d.errs)
	res := &Resource{Index: index, ID: SyncResourceID, Mode: ModeOwn, Pos: d.pos(resolve(n))}
	d.decodeFunction(res, n, field, []any{"spec", "function"}, docVal)
	if len(d.errs) > errsBefore || res.Function == nil {
		return nil
	}
	return res
}

// Sync is the resource the rule's function (spec.function) is, or nil.
func (r *Rule) Sync() *Resource {
	for _, res := range r.Resources {
		if res.Function != nil && res.Function.Sync {
			return res
		}
	}
	return nil
}

// Finalizes reports whether the rule's function has a finalize function:
// the rule then holds every trigger with its finalizer until it answers
// finalized.
func (r *Rule) Finalizes() bool {
	s := r.Sync()
	return s != nil && s.Function.Finalize != nil
}

// HoldsTriggers reports whether the rule may hold its triggers with its
// finalizer (TeardownFinalizer): it orders their teardown, or has a
// finalize function.
func (r *Rule) HoldsTriggers() bool { return r.OrdersTeardown() || r.Finalizes() }

// WritesStatus reports whether the rule writes its triggers' status: it
// has a status template, or a function, which returns a status.
func (r *Rule) WritesStatus() bool { return r.Status != nil || r.Sync() != nil }

// WritesStatusField reports whether key is a field of the triggers'
// status the rule writes: all of them for a rule with a function.
func (r *Rule) WritesStatusField(key string) bool {
	return r.Sync() != nil || (r.Status != nil && slices.Contains(r.Status.Keys(), key))
}
