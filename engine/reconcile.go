package engine

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// AnnotationAppliedHash holds a hash of the child as syncloop last applied
// it. A child whose hash matches and whose fields hold what the rule wants
// is not applied again: no write in steady state. A changed template —
// including a removed field, which comparing fields cannot see — changes
// the hash.
const AnnotationAppliedHash = rules.Group + "/applied-hash"

// reconcile brings one trigger's children and status to what the rule
// wants. It reads only from the informer caches; it writes only what
// differs.
func (c *controller) reconcile(ctx context.Context, key cache.ObjectName) error {
	owner := rules.Trigger{APIVersion: c.rule.Watch.APIVersion, Kind: c.rule.Watch.Kind, Namespace: key.Namespace, Name: key.Name}.String()
	existing := c.childrenOf(owner)

	obj, exists, err := c.trigger.Indexer().GetByKey(key.String())
	if err != nil {
		return err
	}
	var trigger *unstructured.Unstructured
	if exists {
		trigger = obj.(*unstructured.Unstructured)
	} else if !c.trigger.HasSynced() {
		// The triggers are still listing (workers start before they
		// have): this one may not have arrived yet. Its Add, or the sweep
		// once the list is complete, queues it again; pruning now could
		// delete the children of a trigger that exists.
		return nil
	}
	ref := rules.ObjectRef{APIVersion: c.rule.Watch.APIVersion, Kind: c.rule.Watch.Kind, Namespace: key.Namespace, Name: key.Name}
	ch := &changes{}
	if trigger == nil || trigger.GetDeletionTimestamp() != nil {
		c.deps.set(key, nil)
		c.patchDeps.setKeys(key, nil)
		return errors.Join(c.prune(ctx, ch, ref, owner, existing, nil), c.releasePatches(ctx, ch, ref, key, nil))
	}
	defer c.e.reconciled(trigger, ch)

	lk := &cacheLookuper{c: c, trigger: key}
	rd, err := c.rule.Render(ctx, trigger, c.e.mapper, lk)
	// What the render read, even when it failed: a source created or
	// fixed later queues the trigger again.
	c.deps.set(key, lk.queries)
	if err != nil {
		c.e.failed(trigger, err)
		return err
	}
	if rd.Skipped {
		c.patchDeps.setKeys(key, nil)
		return errors.Join(c.prune(ctx, ch, ref, owner, existing, nil), c.releasePatches(ctx, ch, ref, key, nil))
	}

	desired := map[childRef]bool{}
	patched := map[childRef]bool{}
	patchKeys := map[depKey]bool{}
	live := map[childRef]map[string]any{}
	var errs []error
	for _, child := range rd.Children {
		ref := refOf(child.Object)
		var out map[string]any
		var err error
		if child.Patch {
			patched[ref] = true
			patchKeys[depKey{lookup: child.Resource.Index, namespace: ref.namespace, name: ref.name}] = true
			out, err = c.applyPatch(ctx, ch, trigger, key, child)
		} else {
			desired[ref] = true
			out, err = c.applyChild(ctx, ch, trigger, child)
		}
		if err != nil {
			c.e.failed(trigger, err)
			errs = append(errs, err)
			continue
		}
		if out != nil {
			live[ref] = out
		}
	}
	c.patchDeps.setKeys(key, patchKeys)
	if err := c.prune(ctx, ch, ref, owner, existing, desired); err != nil {
		errs = append(errs, err)
	}
	if err := c.releasePatches(ctx, ch, ref, key, patched); err != nil {
		errs = append(errs, err)
	}
	if c.rule.Status != nil {
		if err := c.writeStatus(ctx, trigger, rd, live); err != nil {
			c.e.failed(trigger, err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// childrenOf returns this rule's children of one trigger, from the caches.
func (c *controller) childrenOf(owner string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, ck := range c.children {
		if ck.sub == nil {
			continue
		}
		objs, _ := ck.sub.Indexer().ByIndex(ownerIndex, ownerKey(c.rule.Name, owner))
		for _, o := range objs {
			out = append(out, o.(*unstructured.Unstructured))
		}
	}
	return out
}

// applyChild server-side applies one rendered child unless the cached copy
// already is what the rule wants, and notes the write in ch. It returns the
// child as it now is — when the rule reads live children (its status);
// otherwise nil once applied.
func (c *controller) applyChild(ctx context.Context, ch *changes, trigger *unstructured.Unstructured, child rules.Child) (map[string]any, error) {
	obj := child.Object
	ref := refOf(obj)
	if c.e.ns != "" && ref.namespace != c.e.ns {
		return nil, fmt.Errorf("resource %q: %s %s is outside namespace %q, to which syncloop is limited (--watch-namespace)", child.ResourceID, ref.gvk.Kind, cacheKey(ref), c.e.ns)
	}
	ck := c.children[ref.gvk]
	hash := contentHash(obj.Object)
	ann := obj.GetAnnotations()
	ann[AnnotationAppliedHash] = hash
	obj.SetAnnotations(ann)

	cachedObj, found, err := ck.sub.Indexer().GetByKey(cacheKey(ref))
	if err != nil {
		return nil, err
	}
	var cached *unstructured.Unstructured
	if found {
		cached = cachedObj.(*unstructured.Unstructured)
		if other := cached.GetLabels()[rules.LabelRule]; other != c.rule.Name {
			return nil, fmt.Errorf("resource %q: %s %s is managed by rule %q: not taking it over", child.ResourceID, ref.gvk.Kind, cacheKey(ref), other)
		}
		if c.upToDate(ref, cached, obj, hash) {
			c.e.metrics.Write(c.rule.Name, "unchanged")
			return cached.Object, nil
		}
	}

	manager := rules.FieldManagerPrefix + c.rule.Name
	if c.e.plan != nil { // the answer is what the server would store
		out, err := c.e.writer.Apply(ctx, ck.mapping, obj, manager, c.rule.ForceConflicts)
		if err != nil {
			return nil, fmt.Errorf("resource %q: applying %s %s: %w", child.ResourceID, ref.gvk.Kind, cacheKey(ref), err)
		}
		a := Action{Action: ActionCreate, Rule: c.rule.Name, Trigger: rules.RefOf(trigger), Object: rules.RefOf(obj)}
		if cached != nil {
			a.Action = ActionUpdate
			a.Diff = diffObjects(groupKind(ref), cached.Object, out.Object, obj.Object)
		}
		if a.Action == ActionCreate || a.Diff != "" {
			c.e.plan.Plan(a)
		}
		return out.Object, nil
	}
	// The answer is decoded whole only when the rule reads live children.
	var live map[string]any
	var rv string
	if c.rule.Status != nil {
		out, err := c.e.writer.Apply(ctx, ck.mapping, obj, manager, c.rule.ForceConflicts)
		if err == nil {
			live, rv = out.Object, out.GetResourceVersion()
		}
	} else {
		rv, err = c.e.writer.ApplyVersion(ctx, ck.mapping, obj, manager, c.rule.ForceConflicts)
	}
	if err != nil {
		return nil, fmt.Errorf("resource %q: applying %s %s: %w", child.ResourceID, ref.gvk.Kind, cacheKey(ref), err)
	}
	c.rememberApplied(ref, rv)
	action := "update"
	if cached == nil {
		action = "create"
	}
	c.e.metrics.Write(c.rule.Name, action)
	klog.FromContext(ctx).V(2).Info("Applied child", "action", action, "kind", ref.gvk.Kind, "child", klog.KObj(obj))
	done := "Updated"
	if cached == nil {
		done = "Created"
	}
	ch.applied = append(ch.applied, fmt.Sprintf("%s %s %s", done, ref.gvk.Kind, cacheKey(ref)))
	return live, nil
}

// rememberApplied notes the resourceVersion syncloop's own apply of ref
// returned: the cache's echo of it needs no reconcile.
func (c *controller) rememberApplied(ref childRef, rv string) {
	c.mu.Lock()
	c.applied[ref] = rv
	c.mu.Unlock()
}

// upToDate reports whether applying desired would change nothing: the
// cached child carries the hash of this desired content, and either is
// still the version our own last apply produced or holds every desired
// field (it was changed by someone else, but not in the fields we own).
func (c *controller) upToDate(ref childRef, cached, desired *unstructured.Unstructured, hash string) bool {
	if cached.GetAnnotations()[AnnotationAppliedHash] != hash {
		return false
	}
	c.mu.Lock()
	rv, ok := c.applied[ref]
	c.mu.Unlock()
	if ok && rv == cached.GetResourceVersion() {
		return true
	}
	return holds(cached.Object, desired.Object)
}

// prune deletes this trigger's children that are not desired — all of them
// when desired is nil — unless the rule orphans them, and notes each delete
// in ch. mayPrune decides each
// delete; every delete carries the child's UID as a precondition, so an
// object replaced meanwhile is never deleted.
//
// existing comes from synced informer caches only: a controller reconciles
// nothing before its informers have synced, and a relist replaces a cache
// whole, so a stale or empty cache never stands for an absent child.
func (c *controller) prune(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, owner string, existing []*unstructured.Unstructured, desired map[childRef]bool) error {
	if c.rule.DeletionPolicy == rules.DeletionOrphan {
		return nil
	}
	var errs []error
	for _, child := range existing {
		if !mayPrune(c.rule.Name, owner, child, desired) {
			continue
		}
		ref := refOf(child)
		ck, ok := c.children[ref.gvk]
		if !ok {
			continue
		}
		// Remembered before the request, so that the informer's delete
		// event, which may come before Delete returns, forgets it.
		c.mu.Lock()
		gone := c.deleted[ref] == child.GetUID()
		if !gone && c.e.plan == nil {
			c.deleted[ref] = child.GetUID()
		}
		c.mu.Unlock()
		if gone { // deleted already; the cache has not caught up
			continue
		}
		err := c.e.writer.Delete(ctx, ck.mapping, ref.namespace, ref.name, child.GetUID())
		if err != nil {
			c.mu.Lock()
			delete(c.deleted, ref)
			c.mu.Unlock()
		}
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or replaced by another object: nothing to prune.
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("pruning %s %s: %w", ref.gvk.Kind, cacheKey(ref), err))
			continue
		case c.e.plan != nil:
			c.e.plan.Plan(Action{Action: ActionDelete, Rule: c.rule.Name, Trigger: triggerRef, Object: rules.RefOf(child)})
			continue
		}
		c.mu.Lock()
		delete(c.applied, ref)
		c.mu.Unlock()
		c.e.metrics.Write(c.rule.Name, "delete")
		klog.FromContext(ctx).V(2).Info("Pruned child", "kind", ref.gvk.Kind, "child", klog.KObj(child))
		ch.pruned = append(ch.pruned, fmt.Sprintf("Deleted %s %s", ref.gvk.Kind, cacheKey(ref)))
	}
	return errors.Join(errs...)
}

// mayPrune is the one test every delete passes: child carries syncloop's
// managed-by label, this rule's label, a trigger UID label, and the owner
// annotation of the trigger being reconciled — and is not among that
// trigger's desired children (desired nil: the trigger is gone or its
// when is false, and no child is desired). An object without any of these
// labels is never deleted, whatever its name. A child whose UID label names
// an earlier trigger of the same name (deleted and created again) is that
// trigger's orphan: pruned unless desired, and then adopted.
func mayPrune(rule, owner string, child *unstructured.Unstructured, desired map[childRef]bool) bool {
	l := child.GetLabels()
	return child.GetUID() != "" && // the delete's precondition
		l[rules.LabelManagedBy] == rules.ManagedByValue &&
		l[rules.LabelRule] == rule &&
		l[rules.LabelOwnerUID] != "" &&
		child.GetAnnotations()[rules.AnnotationOwner] == owner &&
		!desired[refOf(child)]
}

// writeStatus server-side applies the rendered status to the trigger's
// status subresource, unless the trigger's status already holds it.
func (c *controller) writeStatus(ctx context.Context, trigger *unstructured.Unstructured, rd *rules.Rendered, live map[childRef]map[string]any) error {
	status, err := rd.Status(ctx, func(ch rules.Child) (map[string]any, bool) {
		o, ok := live[refOf(ch.Object)]
		return o, ok
	})
	if err != nil || status == nil {
		return err
	}
	if holds(trigger.Object["status"], status) {
		return nil
	}
	patch := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": trigger.GetAPIVersion(),
		"kind":       trigger.GetKind(),
		"metadata":   map[string]any{"name": trigger.GetName(), "namespace": trigger.GetNamespace()},
		"status":     status,
	}}
	if trigger.GetNamespace() == "" {
		delete(patch.Object["metadata"].(map[string]any), "namespace")
	}
	out, err := c.e.writer.ApplyStatus(ctx, c.triggerMapping, patch, rules.FieldManagerPrefix+c.rule.Name, true)
	if err != nil {
		return fmt.Errorf("writing status: %w", err)
	}
	if c.e.plan != nil {
		shape := map[string]any{"status": status}
		diff := diffObjects(groupKind(refOf(trigger)), trigger.Object, out.Object, shape)
		if diff != "" {
			ref := rules.RefOf(trigger)
			c.e.plan.Plan(Action{Action: ActionStatus, Rule: c.rule.Name, Trigger: ref, Object: ref, Diff: diff})
		}
		return nil
	}
	c.e.metrics.Write(c.rule.Name, "status")
	return nil
}

// groupKind is "Kind.group", as Redact wants it.
func groupKind(ref childRef) string { return ref.gvk.Kind + "." + ref.gvk.Group }

func cacheKey(ref childRef) string {
	if ref.namespace == "" {
		return ref.name
	}
	return ref.namespace + "/" + ref.name
}
