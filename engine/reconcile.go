package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
		c.writes.forgetConflicts(key)
		return errors.Join(c.prune(ctx, ch, ref, owner, existing, nil, nil), c.releasePatches(ctx, ch, ref, key, nil, nil))
	}
	defer c.e.reconciled(trigger, ch)

	lk := &cacheLookuper{c: c, trigger: key}
	ap := &applier{c: c, ch: ch, trigger: trigger, key: key,
		desired: map[childRef]bool{}, patched: map[childRef]bool{}, patchKeys: map[depKey]bool{}}
	rd, err := c.rule.Render(ctx, trigger, c.e.mapper, lk, ap)
	// What the render read, even when it failed: a source created or
	// fixed later queues the trigger again.
	c.deps.set(key, lk.queries)
	if err != nil {
		c.e.failed(trigger, err)
		if c.rule.Status != nil {
			// Keep what the patch index knows: nothing was released.
			return errors.Join(err, c.writeStatus(ctx, trigger, nil, err))
		}
		return err
	}
	if rd.Skipped {
		c.patchDeps.setKeys(key, nil)
		c.writes.forgetConflicts(key)
		return errors.Join(c.prune(ctx, ch, ref, owner, existing, nil, nil), c.releasePatches(ctx, ch, ref, key, nil, nil))
	}
	errs := c.conflicts(trigger, rd, ap.errs)
	for _, ce := range rd.Conflicts { // wanted, though not applied: not pruned either
		ap.desired[childRef{gvk: schema.FromAPIVersionAndKind(ce.Object.APIVersion, ce.Object.Kind), namespace: ce.Object.Namespace, name: ce.Object.Name}] = true
	}

	// A resource that waits for its dependencies keeps its children as they
	// are: neither changed nor pruned nor released.
	waiting := map[string]bool{}
	var waitingKinds []schema.GroupVersionKind
	for _, st := range rd.Waiting() {
		waiting[st.Resource.ID] = true
		if st.Resource.Mode == rules.ModePatch {
			waitingKinds = append(waitingKinds, st.Resource.GVK)
			c.keepPatchKeys(key, st.Resource, ap.patchKeys)
		}
		if c.e.plan != nil {
			c.planWait(trigger, st)
		} else {
			c.e.metrics.Write(c.rule.Name, "wait")
		}
	}
	c.patchDeps.setKeys(key, ap.patchKeys)
	if err := c.prune(ctx, ch, ref, owner, existing, ap.desired, waiting); err != nil {
		errs = append(errs, err)
	}
	if err := c.releasePatches(ctx, ch, ref, key, ap.patched, waitingKinds); err != nil {
		errs = append(errs, err)
	}
	if c.rule.Status != nil {
		if err := c.writeStatus(ctx, trigger, rd, errors.Join(errs...)); err != nil {
			c.e.failed(trigger, err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applier applies the children of one reconcile as the render walks the
// rule's resources in dependency order, and notes what it applied.
type applier struct {
	c         *controller
	ch        *changes
	trigger   *unstructured.Unstructured
	key       cache.ObjectName
	desired   map[childRef]bool // owned children rendered
	patched   map[childRef]bool // objects patched
	patchKeys map[depKey]bool
	errs      []error
}

// DryRun implements rules.DryRunner.
func (a *applier) DryRun() bool { return a.c.e.plan != nil }

// Apply implements rules.Applier.
func (a *applier) Apply(ctx context.Context, child rules.Child) (map[string]any, error) {
	c := a.c
	ref := refOf(child.Object)
	var out map[string]any
	var err error
	if child.Patch {
		a.patched[ref] = true
		a.patchKeys[depKey{lookup: child.Resource.Index, namespace: ref.namespace, name: ref.name}] = true
		out, err = c.applyPatch(ctx, a.ch, a.trigger, a.key, child)
	} else {
		a.desired[ref] = true
		out, err = c.applyChild(ctx, a.ch, a.trigger, child)
	}
	if err != nil {
		if _, conflict := errors.AsType[*rules.ConflictError](err); !conflict { // reported with the render's conflicts
			c.e.failed(a.trigger, err)
		}
		a.errs = append(a.errs, err)
	}
	return out, err
}

// conflicts reports each of the render's conflicts — a Warning Event on the
// trigger, syncloop_apply_total{action="conflict"}, or a line of the plan —
// and returns errs with those that did not come from the applier (a child
// that is what a lookup reads): every conflict fails the reconcile, which
// is retried with backoff (an object may be removed or annotated for
// adoption meanwhile).
func (c *controller) conflicts(trigger *unstructured.Unstructured, rd *rules.Rendered, errs []error) []error {
	for _, ce := range rd.Conflicts {
		if !slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, ce) }) {
			errs = append(errs, ce)
		}
		if c.e.plan != nil {
			c.e.plan.Plan(Action{Action: ActionConflict, Rule: c.rule.Name, Trigger: rules.RefOf(trigger), Object: ce.Object,
				Resource: ce.Resource, Reason: ce.Error()})
			continue
		}
		c.e.metrics.Write(c.rule.Name, "conflict")
		c.e.event(trigger, corev1.EventTypeWarning, rules.ReasonChildConflict, ce.Error())
	}
	return errs
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

// createOnlyVersion is the resourceVersion a child is applied with when
// syncloop's caches hold no object of its name: with it, the apply
// creates the object if none exists and fails with a Conflict if one does
// — which the cache could not see, as it holds syncloop's children only —
// so that an object syncloop did not create is never written unseen, at
// the cost of no request in the common case. "1" is the revision of an
// empty etcd: no object ever has it.
const createOnlyVersion = "1"

// applyChild server-side applies one rendered child unless the cached copy
// already is what the rule wants, and notes the write in ch. An object
// under the child's name that syncloop may not take over (rules.Rule.
// Takeover) is left as it is: the child is a conflict. It returns the
// child as it now is when the rule reads it (rules.Rule.ReadsLive),
// otherwise what it applied.
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
	key := cache.ObjectName{Namespace: trigger.GetNamespace(), Name: trigger.GetName()}
	fail := func(what string, err error) error {
		return fmt.Errorf("resource %q: %s %s %s: %w", child.ResourceID, what, ref.gvk.Kind, cacheKey(ref), err)
	}

	existing, err := c.existing(ctx, ck, ref, key)
	if err != nil {
		return nil, fail("reading", err)
	}
	for {
		adopt := false
		if existing != nil {
			if adopt, err = c.rule.Takeover(child, rules.TriggerOf(trigger), existing); err != nil {
				c.writes.conflict(key, ref, true)
				return nil, err
			}
			if !adopt && c.upToDate(ref, existing, obj, hash) {
				c.writes.conflict(key, ref, false)
				c.e.metrics.Write(c.rule.Name, "unchanged")
				return existing.Object, nil
			}
		}
		live, err := c.write(ctx, ck, ref, obj, key, child, existing == nil)
		if existing == nil && apierrors.IsConflict(err) {
			// An object the cache does not hold has the child's name:
			// read it, and decide whether it may be written (once: it
			// exists now).
			live, gerr := c.e.writer.Get(ctx, ck.mapping, ref.namespace, ref.name)
			if gerr != nil {
				return nil, fail("reading", gerr)
			}
			existing = live
			continue
		}
		if err != nil {
			return nil, fail("applying", err)
		}
		c.writes.conflict(key, ref, false)
		c.wrote(ctx, ch, trigger, obj, existing, live, adopt)
		return live, nil
	}
}

// existing is the object under ref's name as far as syncloop can tell
// without a request: its cached child, or nil. The API server is asked
// only when the cache may not know: just after a handover (the replica
// that had the trigger may have made the child a moment ago; see
// handoverVerify), or when the last apply found a conflict there (an
// object the cache cannot hold).
func (c *controller) existing(ctx context.Context, ck *childKind, ref childRef, key cache.ObjectName) (*unstructured.Unstructured, error) {
	cachedObj, found, err := ck.sub.Indexer().GetByKey(cacheKey(ref))
	if err != nil {
		return nil, err
	}
	if found {
		return cachedObj.(*unstructured.Unstructured), nil
	}
	if !c.mayLag(key) && !c.writes.hadConflict(key, ref) {
		return nil, nil
	}
	live, err := c.e.writer.Get(ctx, ck.mapping, ref.namespace, ref.name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return live, nil
}

// write server-side applies obj — only if no object of its name exists,
// when createOnly — and returns the child as it now is when the rule reads
// it, otherwise what it applied. In a dry run it returns what the server
// would store.
func (c *controller) write(ctx context.Context, ck *childKind, ref childRef, obj *unstructured.Unstructured, key cache.ObjectName, child rules.Child, createOnly bool) (map[string]any, error) {
	if createOnly {
		obj.SetResourceVersion(createOnlyVersion)
		defer obj.SetResourceVersion("")
	}
	manager := c.rule.FieldManager()
	if c.e.plan != nil {
		out, err := c.e.writer.Apply(ctx, ck.mapping, obj, manager, c.rule.ForceConflicts)
		if err != nil {
			return nil, err
		}
		return out.Object, nil
	}
	// The answer is decoded whole only when the rule reads live children;
	// otherwise the applied object stands for it.
	live := obj.Object
	var rv string
	var err error
	c.writes.applying(ref)
	if c.rule.ReadsLive(child.Resource) {
		out, aerr := c.e.writer.Apply(ctx, ck.mapping, obj, manager, c.rule.ForceConflicts)
		if err = aerr; err == nil {
			live, rv = out.Object, out.GetResourceVersion()
		}
	} else {
		rv, err = c.e.writer.ApplyVersion(ctx, ck.mapping, obj, manager, c.rule.ForceConflicts)
	}
	if c.writes.applyDone(ref, rv) {
		c.add(key)
	}
	return live, err
}

// wrote counts, logs and notes one write of obj over existing (nil: a
// create), or, in a dry run, plans it.
func (c *controller) wrote(ctx context.Context, ch *changes, trigger, obj, existing *unstructured.Unstructured, live map[string]any, adopt bool) {
	action := ActionUpdate
	switch {
	case existing == nil:
		action = ActionCreate
	case adopt:
		action = ActionAdopt
	}
	if c.e.plan != nil {
		a := Action{Action: action, Rule: c.rule.Name, Trigger: rules.RefOf(trigger), Object: rules.RefOf(obj)}
		if existing != nil {
			a.Diff = diffObjects(groupKind(refOf(obj)), existing.Object, live, obj.Object)
		}
		if a.Action == ActionCreate || a.Diff != "" {
			c.e.plan.Plan(a)
		}
		return
	}
	c.e.metrics.Write(c.rule.Name, action)
	klog.FromContext(ctx).V(2).Info("Applied child", "action", action, "kind", obj.GetKind(), "child", klog.KObj(obj))
	done := map[string]string{ActionCreate: "Created", ActionUpdate: "Updated", ActionAdopt: "Adopted"}[action]
	ch.applied = append(ch.applied, fmt.Sprintf("%s %s %s", done, obj.GetKind(), cacheKey(refOf(obj))))
	if adopt {
		klog.FromContext(ctx).Info("Adopted an object syncloop did not create", "kind", obj.GetKind(), "object", klog.KObj(obj))
	}
}

// upToDate reports whether applying desired would change nothing: the
// cached child carries the hash of this desired content, and either is
// still the version our own last apply produced or holds every desired
// field (it was changed by someone else, but not in the fields we own).
func (c *controller) upToDate(ref childRef, cached, desired *unstructured.Unstructured, hash string) bool {
	if cached.GetAnnotations()[AnnotationAppliedHash] != hash {
		return false
	}
	return c.writes.isOwnVersion(ref, cached.GetResourceVersion()) || holds(cached.Object, desired.Object)
}

// prune deletes this trigger's children that are not desired — all of them
// when desired is nil — unless their resource orphans them or waits (its
// id in waiting), and notes each delete in ch. Dependents go first: the
// deletes follow the rule's dependency order backwards, children of
// resources no longer in the rule first of all. mayPrune decides each
// delete; every delete carries the child's UID as a precondition, so an
// object replaced meanwhile is never deleted.
//
// existing comes from synced informer caches only: a controller reconciles
// nothing before its informers have synced, and a relist replaces a cache
// whole, so a stale or empty cache never stands for an absent child.
func (c *controller) prune(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, owner string, existing []*unstructured.Unstructured, desired map[childRef]bool, waiting map[string]bool) error {
	var doomed []*unstructured.Unstructured
	for _, child := range existing {
		id := child.GetAnnotations()[rules.AnnotationResourceID]
		if waiting[id] || c.deletionPolicy(id) == rules.DeletionOrphan || !mayPrune(c.rule.Name, owner, child, desired) {
			continue
		}
		if l := c.readByLookup(child); l != nil {
			// An object a lookup reads is a source, whatever its labels say
			// (an earlier syncloop may have taken it over): never deleted.
			klog.FromContext(ctx).Info("Not pruning a child that a lookup reads", "kind", child.GetKind(), "child", klog.KObj(child), "lookup", l.ID)
			continue
		}
		doomed = append(doomed, child)
	}
	if len(doomed) == 0 {
		return nil
	}
	// Reverse dependency order; a child whose resource is gone from the
	// rule depends on nothing syncloop knows, and goes first.
	rank := func(u *unstructured.Unstructured) int {
		if res := c.rule.Resource(u.GetAnnotations()[rules.AnnotationResourceID]); res != nil {
			return res.Rank
		}
		return len(c.rule.Order)
	}
	slices.SortStableFunc(doomed, func(a, b *unstructured.Unstructured) int { return rank(b) - rank(a) })
	var errs []error
	for _, child := range doomed {
		ref := refOf(child)
		ck, ok := c.children[ref.gvk]
		if !ok {
			continue
		}
		// Deleted already: the cache has not caught up, or has since this
		// reconcile read it (in that order: the cache drops a child before
		// its delete event makes ownWrites forget the delete).
		if c.writes.deletedAlready(ref, child.GetUID()) || !c.cached(ck, child) ||
			(c.e.plan == nil && !c.writes.deleting(ref, child.GetUID())) {
			continue
		}
		err := c.e.writer.Delete(ctx, ck.mapping, ref.namespace, ref.name, child.GetUID())
		if err != nil {
			c.writes.deleteFailed(ref)
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
		c.writes.deleteDone(ref)
		c.e.metrics.Write(c.rule.Name, "delete")
		klog.FromContext(ctx).V(2).Info("Pruned child", "kind", ref.gvk.Kind, "child", klog.KObj(child))
		ch.pruned = append(ch.pruned, fmt.Sprintf("Deleted %s %s", ref.gvk.Kind, cacheKey(ref)))
	}
	return errors.Join(errs...)
}

// readByLookup returns the rule's lookup by name that reads obj, as its
// literal name says or as a trigger's last reconcile read it; nil if none.
// A literal name without a literal namespace is taken to read obj in any
// namespace.
func (c *controller) readByLookup(obj *unstructured.Unstructured) *rules.Lookup {
	gk := obj.GroupVersionKind().GroupKind()
	for _, l := range c.rule.Lookups {
		if l.List() || l.GVK.GroupKind() != gk {
			continue
		}
		literal := l.Name.IsLiteral() && l.Name.Literal == obj.GetName() &&
			(!l.Namespace.IsLiteral() || l.Namespace.Literal == "" || l.Namespace.Literal == obj.GetNamespace())
		if literal || c.deps.readsNamed(l.Index, obj.GetNamespace(), obj.GetName()) {
			return l
		}
	}
	return nil
}

// deletionPolicy is the policy of the resource with this id: its own, or
// the rule's for a resource no longer in the rule.
func (c *controller) deletionPolicy(id string) rules.DeletionPolicy {
	if res := c.rule.Resource(id); res != nil {
		return res.DeletionPolicy
	}
	return c.rule.DeletionPolicy
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

// writeStatus server-side applies the rule's status and the Ready
// condition to the trigger's status subresource, unless the trigger's
// status already holds them. rd is nil when rendering failed, failure the
// error of a reconcile that failed: the condition then says
// ReconcileFailed and the rule's status fields keep the values they have.
func (c *controller) writeStatus(ctx context.Context, trigger *unstructured.Unstructured, rd *rules.Rendered, failure error) error {
	var status map[string]any
	var cond rules.Condition
	var statusErr error // the rule's status failed to render: still an error once the condition says so
	if rd != nil {
		if rd.Skipped {
			return nil
		}
		if status, statusErr = rd.Status(ctx); statusErr != nil {
			failure = errors.Join(failure, statusErr)
		}
		cond = rd.Readiness()
	}
	rendered := status
	if failure != nil {
		cond = rules.Failed(failure)
	}
	// desired is the status to write over current.
	desired := func(current map[string]any) map[string]any {
		status := maps.Clone(rendered)
		if status == nil { // failed, or waits for a lookup: keep the fields the rule writes as they are
			status = map[string]any{}
			for _, k := range c.rule.Status.Keys() {
				if v, ok := current[k]; ok && k != "conditions" {
					status[k] = v
				}
			}
		}
		status["conditions"] = cond.Conditions(current["conditions"], status["conditions"], trigger.GetGeneration(), time.Now())
		return status
	}
	current, _ := trigger.Object["status"].(map[string]any)
	status = desired(current)
	if holds(current, status) {
		return statusErr
	}
	if c.mayLag(cache.ObjectName{Namespace: trigger.GetNamespace(), Name: trigger.GetName()}) {
		// Just handed over: the previous owner may have written this
		// status a moment ago (see handoverVerify).
		if live, err := c.e.writer.Get(ctx, c.triggerMapping, trigger.GetNamespace(), trigger.GetName()); err == nil {
			current, _ = live.Object["status"].(map[string]any)
			if status = desired(current); holds(current, status) {
				return statusErr
			}
		}
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
	out, err := c.e.writer.ApplyStatus(ctx, c.triggerMapping, patch, c.rule.FieldManager(), true)
	if err != nil {
		return errors.Join(statusErr, fmt.Errorf("writing status: %w", err))
	}
	if c.e.plan != nil {
		shape := map[string]any{"status": status}
		diff := diffObjects(groupKind(refOf(trigger)), trigger.Object, out.Object, shape)
		if diff != "" {
			ref := rules.RefOf(trigger)
			c.e.plan.Plan(Action{Action: ActionStatus, Rule: c.rule.Name, Trigger: ref, Object: ref, Diff: diff})
		}
		return statusErr
	}
	c.e.metrics.Write(c.rule.Name, "status")
	return statusErr
}

// cached reports whether child is still in its kind's cache, as the same
// object. forget drops a deleted child from ownWrites only after the cache
// has dropped it, so a reconcile that read the child before either finds
// it in one or the other and does not delete it twice.
func (c *controller) cached(ck *childKind, child *unstructured.Unstructured) bool {
	if ck.sub == nil {
		return true
	}
	obj, ok, err := ck.sub.Indexer().GetByKey(cacheKey(refOf(child)))
	if err != nil || !ok {
		return false
	}
	u, isU := obj.(*unstructured.Unstructured)
	return !isU || u.GetUID() == child.GetUID()
}

// planWait reports, in a dry run, a resource that would wait for its
// dependencies.
func (c *controller) planWait(trigger *unstructured.Unstructured, st *rules.ResourceState) {
	res := st.Resource
	c.e.plan.Plan(Action{Action: ActionWait, Rule: c.rule.Name, Trigger: rules.RefOf(trigger), Resource: res.ID,
		Object: rules.ObjectRef{APIVersion: res.APIVersion, Kind: res.Kind, Namespace: res.LiteralNamespace, Name: res.LiteralName},
		Reason: st.Why})
}

// groupKind is "Kind.group", as Redact wants it.
func groupKind(ref childRef) string { return ref.gvk.Kind + "." + ref.gvk.Group }

func cacheKey(ref childRef) string {
	if ref.namespace == "" {
		return ref.name
	}
	return ref.namespace + "/" + ref.name
}
