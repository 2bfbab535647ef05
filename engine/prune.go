package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// prune deletes this trigger's children that are not desired — all of them
// when desired is nil — unless their resource orphans them or waits (its
// id in waiting), and notes each delete in ch. Dependents go first: the
// deletes follow the rule's dependency order backwards, children of
// resources no longer in the rule first of all. mayPrune decides each
// delete; every delete carries the child's UID as a precondition, so an
// object replaced meanwhile is never deleted.
//
// existing comes from synced informer caches only: a loop reconciles
// nothing before its informers have synced, and a relist replaces a cache
// whole, so a stale or empty cache never stands for an absent child.
func (rc *reconciler) prune(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, owner string, existing []object, desired map[childRef]bool, waiting map[string]bool) error {
	doomed := rc.prunable(ctx, owner, existing, desired, waiting, true)
	// Reverse dependency order; a child whose resource is gone from the
	// rule depends on nothing syncloop knows, and goes first.
	rank := func(u object) int {
		if res := rc.rule.Resource(rules.Annotation(u, rules.AnnotationResourceID)); res != nil {
			return res.Rank
		}
		return len(rc.rule.Order)
	}
	slices.SortStableFunc(doomed, func(a, b object) int { return rank(b) - rank(a) })
	var errs []error
	for _, child := range doomed {
		ref := refOf(child)
		ck, ok := rc.w.children[ref.gvk]
		// Deleted already: the cache has not caught up, or has since this
		// reconcile read it (in that order: the cache drops a child before
		// its delete event makes ownWrites forget the delete).
		if !ok || rc.writes.deletedAlready(ref, child.GetUID()) || !cached(ck, child) {
			continue
		}
		if err := rc.out.delete(ctx, ck.mapping, triggerRef, child, ch, metav1.DeletePropagationBackground); err != nil {
			errs = append(errs, fmt.Errorf("pruning %s %s: %w", ref.gvk.Kind, cacheKey(ref), err))
		}
	}
	return errors.Join(errs...)
}

// prunable are the children of existing that prune deletes: not desired,
// not of a resource that waits or orphans, not what a lookup reads (which
// is logged when say is true).
func (rc *reconciler) prunable(ctx context.Context, owner string, existing []object, desired map[childRef]bool, waiting map[string]bool, say bool) []object {
	var doomed []object
	for _, child := range existing {
		id := rules.Annotation(child, rules.AnnotationResourceID)
		if waiting[id] || rc.deletionPolicy(id) == rules.DeletionOrphan || !mayPrune(rc.rule.Name, owner, child, desired) || rc.elsewhere(id) {
			continue
		}
		if l := rc.readByLookup(child); l != nil {
			// An object a lookup reads is a source, whatever its labels say
			// (an earlier syncloop may have taken it over): never deleted.
			if say {
				klog.FromContext(ctx).Info("Not pruning a child that a lookup reads", "kind", child.GetObjectKind().GroupVersionKind().Kind, "child", klog.KObj(child), "lookup", l.ID)
			}
			continue
		}
		doomed = append(doomed, child)
	}
	return doomed
}

// readByLookup returns the rule's lookup by name that reads obj, as its
// literal name says or as a trigger's last reconcile read it; nil if none.
// A literal name without a literal namespace is taken to read obj in any
// namespace.
func (rc *reconciler) readByLookup(obj object) *rules.Lookup {
	gk := obj.GetObjectKind().GroupVersionKind().GroupKind()
	for _, l := range rc.rule.Lookups {
		if l.List() || l.GVK.GroupKind() != gk {
			continue
		}
		if readsLiterally(l, obj) || rc.deps.readsNamed(l.Index, obj.GetNamespace(), obj.GetName()) {
			return l
		}
	}
	return nil
}

// readsLiterally reports whether lookup l reads obj, of its kind, by its
// literal name (in any namespace when its namespace is not literal).
func readsLiterally(l *rules.Lookup, obj object) bool {
	return l.Name.IsLiteral() && l.Name.Literal == obj.GetName() &&
		(!l.Namespace.IsLiteral() || l.Namespace.Literal == "" || l.Namespace.Literal == obj.GetNamespace())
}

// elsewhere reports whether the children of resource id belong to
// another place than rc's: a resource that targets clusters seen at home,
// or one that does not seen in a cluster of the fleet — as when a workload
// cluster is syncloop's own, listed in the inventory. They are the other
// place's to prune.
func (rc *reconciler) elsewhere(id string) bool {
	res := rc.rule.Resource(id)
	return res != nil && res.Targets() != (rc.w.cluster != "")
}

// deletionPolicy is the policy of the resource with this id: its own, or
// the rule's for a resource no longer in the rule.
func (rc *reconciler) deletionPolicy(id string) rules.DeletionPolicy {
	if res := rc.rule.Resource(id); res != nil {
		return res.DeletionPolicy
	}
	return rc.rule.DeletionPolicy
}

// mayPrune is the one test every delete passes: child carries syncloop's
// managed-by label, this rule's label, a trigger UID label, and the owner
// annotation of the trigger being reconciled — and is not among that
// trigger's desired children (desired nil: the trigger is gone or its
// when is false, and no child is desired). An object without any of these
// labels is never deleted, whatever its name. A child whose UID label names
// an earlier trigger of the same name (deleted and created again) is that
// trigger's orphan: pruned unless desired, and then adopted.
func mayPrune(rule, owner string, child object, desired map[childRef]bool) bool {
	return child.GetUID() != "" && // the delete's precondition
		rules.Label(child, rules.LabelManagedBy) == rules.ManagedByValue &&
		childOf(rule, owner, child) &&
		rules.Label(child, rules.LabelOwnerUID) != "" &&
		!desired[refOf(child)]
}

// childOf reports whether obj is marked as the child of rule for the
// trigger owner (its rule label and owner annotation).
func childOf(rule, owner string, obj object) bool {
	return rules.Label(obj, rules.LabelRule) == rule && rules.Annotation(obj, rules.AnnotationOwner) == owner
}

// cached reports whether child is still in its kind's cache, as the same
// object. The loop drops a deleted child from ownWrites only after the
// cache has dropped it, so a reconcile that read the child before either
// finds it in one or the other and does not delete it twice.
func cached(ck *childKind, child object) bool {
	if ck.sub == nil {
		return true
	}
	obj, ok, err := ck.sub.Indexer().GetByKey(cacheKey(refOf(child)))
	if err != nil || !ok {
		return false
	}
	o, isO := obj.(object)
	return !isO || o.GetUID() == child.GetUID()
}
