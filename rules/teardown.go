package rules

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Teardown says how a rule's children go when their trigger is deleted.
type Teardown string

const (
	// TeardownOrdered: the trigger carries the rule's finalizer
	// (TeardownFinalizer) while it has children, and syncloop deletes them
	// in waves, dependents first (Resource.Wave): a child is deleted only
	// once every child that reads it is gone. The finalizer goes last.
	TeardownOrdered Teardown = "Ordered"
	// TeardownUnordered: the garbage collector deletes every child at
	// once, following its ownerReference to the trigger.
	TeardownUnordered Teardown = "Unordered"
)

// OrdersTeardown reports whether the rule tears its triggers' children
// down in waves: teardown is Ordered and some resource reads another's
// children (otherwise every child is in the first wave, and the garbage
// collector deletes them as well, with no finalizer to hold the trigger).
//
// A rule whose children go to other clusters always orders it: no
// ownerReference crosses clusters, so only syncloop deletes them there,
// and the trigger is held until it has.
func (r *Rule) OrdersTeardown() bool {
	return r.Teardown == TeardownOrdered && (r.Waves() > 1 || r.TargetsClusters())
}

// Waves is how many waves the rule's teardown has: one more than the
// highest Resource.Wave; 0 without resources.
func (r *Rule) Waves() int {
	n := 0
	for _, res := range r.Resources {
		n = max(n, res.Wave+1)
	}
	return n
}

// TeardownOrder says how the rule's ordered teardown goes, for render's
// notes: "finalizer <f>; deleted, its children go in 2 waves: deployment,
// endpoint, then service".
func (r *Rule) TeardownOrder() string {
	waves := make([][]string, r.Waves())
	for _, res := range r.Resources {
		if res.Mode == ModeOwn {
			waves[res.Wave] = append(waves[res.Wave], res.ID)
		}
	}
	parts := make([]string, 0, len(waves))
	for _, ids := range waves {
		if len(ids) > 0 {
			parts = append(parts, strings.Join(ids, ", "))
		}
	}
	if len(parts) == 1 {
		return fmt.Sprintf("held by the finalizer %s; once it is deleted, its children go at once: %s", r.TeardownFinalizer(), parts[0])
	}
	return fmt.Sprintf("held by the finalizer %s; once it is deleted, its children go in %d waves, dependents first: %s",
		r.TeardownFinalizer(), len(waves), strings.Join(parts, "; then "))
}

// inWaves says how a teardown deletes the children: in n waves, or at
// once.
func inWaves(n int) string {
	if n == 1 {
		return "all at once"
	}
	return fmt.Sprintf("dependents first in %d waves", n)
}

// setWaves gives each resource its teardown wave: 0 when no resource
// reads it, otherwise one after the latest of those that do. Order holds
// every resource after those it reads, so going through it backwards
// meets a resource's dependents before the resource.
func (r *Rule) setWaves() {
	for i := len(r.Order) - 1; i >= 0; i-- {
		res := r.Order[i]
		res.Wave = 0
		for _, dep := range res.Dependents {
			res.Wave = max(res.Wave, dep.Wave+1)
		}
	}
}

// decodeTeardown decodes spec.teardown: Ordered by default for a rule that
// defines its kind (spec.api, as kro tears its instances down), Unordered
// otherwise. validate -v=2 notes what an ordered teardown needs (patch on
// the triggers' kind, for the finalizer), or that it has nothing to order.
func (d *decoder) decodeTeardown(r *Rule, spec *yaml.Node, f map[string]*yaml.Node) {
	r.Teardown = TeardownUnordered
	if r.API != nil || r.TargetsClusters() {
		r.Teardown = TeardownOrdered
	}
	n, set := f["teardown"]
	if set {
		if v, ok := d.oneOf(n, "spec.teardown", string(TeardownOrdered), string(TeardownUnordered)); ok {
			r.Teardown = Teardown(v)
		}
		if r.Teardown == TeardownUnordered && r.TargetsClusters() {
			d.errorf(n, "spec.teardown", "children in other clusters carry no ownerReference for the garbage collector to follow: only syncloop deletes them, holding the trigger with its finalizer until it has (Ordered)")
		}
	} else {
		n = spec
	}
	switch {
	case len(r.Order) != len(r.Resources): // a cycle, reported already
	case r.OrdersTeardown():
		d.noteAt(d.pos(n), "spec.teardown", fmt.Sprintf("its triggers carry the finalizer %s while they have children, deleted %s: the rule needs patch on %s %s",
			r.TeardownFinalizer(), inWaves(r.Waves()), r.Watch.APIVersion, r.Watch.Kind))
	case set && r.Teardown == TeardownOrdered:
		d.noteAt(d.pos(n), "spec.teardown", "Ordered has nothing to order: no resource reads another's children, so the garbage collector deletes them all at once and no finalizer is put on the triggers")
	}
}

// decodeRemoval decodes spec.removalPolicy: Orphan by default (a rule
// removed leaves its children, as syncloop always did), or Delete
// (Kyverno's orphanDownstreamOnPolicyDelete: false), which validate -v=2
// notes with its bound.
func (d *decoder) decodeRemoval(r *Rule, f map[string]*yaml.Node) {
	r.RemovalPolicy = DeletionOrphan
	n, ok := f["removalPolicy"]
	if !ok {
		return
	}
	if v, ok := d.oneOf(n, "spec.removalPolicy", string(DeletionOrphan), string(DeletionDelete)); ok {
		r.RemovalPolicy = DeletionPolicy(v)
	}
	if r.RemovalPolicy == DeletionDelete {
		d.noteAt(d.pos(n), "spec.removalPolicy", fmt.Sprintf("removing the rule deletes its children, dependents first — unless they are more than rollout.maxPrunes (%s) of them: then the removal halts and deletes none", r.Rollout.MaxPrunes))
	}
}

// noteAt adds a note (validate -v=2) of the rule at p.
func (d *decoder) noteAt(p Pos, field, msg string) {
	d.notes = append(d.notes, &Error{Pos: p, Rule: d.rule, Field: field, Msg: "note: " + msg})
}
