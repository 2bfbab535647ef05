package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// reconciler does what one trigger's reconcile does — render, apply,
// prune, release, write status — from the rule's informer caches, and
// writes through its writer only what differs. It holds what a reconcile
// reads and the memory of its own writes, not the queue or the workers:
// when to reconcile which trigger is the loop's.
type reconciler struct {
	rule   *rules.Rule
	w      *watches      // the rule's mappings and caches
	mapper render.Scoper // scopes, for the render
	client liveReader    // reads the API server where the cache may not know
	out    writer        // live, or a plan
	writes *ownWrites

	deps    *lookupIndex // which triggers read which looked-up objects
	patches *lookupIndex // which triggers patch which objects (by resource index)

	metrics Metrics
	// observe, when set, is told what each reconcile made of its trigger
	// (a rollout's health; rd nil when the trigger wanted no children).
	observe func(key cache.ObjectName, rd *render.Rendered, err error)
	// mayLag reports whether the caches may lack a write the previous
	// owner of a trigger made (a handover: see handoverVerify).
	mayLag func(cache.ObjectName) bool
	// fights are the children another writer keeps changing; later
	// queues a trigger again after a while (when a cooling ends).
	fights *fights
	later  func(cache.ObjectName, time.Duration)
	// fleet are the other clusters the rule's children go to; nil when
	// none does (or syncloop has no inventory).
	fleet *loopFleet
}

// liveReader reads one object from the API server, for the few decisions
// the caches cannot make (dynamic.Writer).
type liveReader interface {
	Get(ctx context.Context, m *meta.RESTMapping, namespace, name string) (*unstructured.Unstructured, error)
}

// newReconciler is rule r's reconciler: it reads w's caches, and the API
// server through live only where they cannot tell; it writes through the
// writer out makes, which shares its memory of its own writes. It never
// thinks the caches lag, and a child's fight cooled down is not queued
// again until its loop says how (mayLag, later).
func newReconciler(r *rules.Rule, w *watches, scoper render.Scoper, live liveReader, m Metrics, fp FightPolicy, out func(*ownWrites) writer) *reconciler {
	writes := newOwnWrites()
	return &reconciler{rule: r, w: w, mapper: scoper, client: live, out: out(writes), writes: writes,
		deps: newLookupIndex(), patches: newLookupIndex(), metrics: m, fights: newFights(fp),
		mayLag: func(cache.ObjectName) bool { return false },
		later:  func(cache.ObjectName, time.Duration) {}}
}

// reconcile brings one trigger's children and status to what the rule
// wants. It reads only from the informer caches; it writes only what
// differs. A panic in it fails this reconcile alone (PanicReconcile): a
// Failed Event on the trigger, and the error retried with backoff.
func (rc *reconciler) reconcile(ctx context.Context, key cache.ObjectName) (err error) {
	var rd *render.Rendered
	if rc.observe != nil {
		defer func() { rc.observe(key, rd, err) }()
	}
	defer func() { err = rc.out.ended(key, err) }()
	defer func() {
		if v := recover(); v != nil {
			rd, err = nil, contained(klog.FromContext(ctx), rc.metrics, rc.rule.Name, PanicReconcile, v)
			if obj, exists, _ := rc.w.trigger.Indexer().GetByKey(key.String()); exists {
				rc.out.failed(wholeOf(obj), err)
			}
		}
	}()
	rd, err = rc.sync(ctx, key)
	return err
}

// triggerRef is the reference of the rule's trigger key.
func (rc *reconciler) triggerRef(key cache.ObjectName) rules.ObjectRef {
	return rules.ObjectRef{APIVersion: rc.rule.Watch.APIVersion, Kind: rc.rule.Watch.Kind, Namespace: key.Namespace, Name: key.Name}
}

// sync is the reconcile of trigger key; rd is what its render made (nil
// when it rendered nothing).
func (rc *reconciler) sync(ctx context.Context, key cache.ObjectName) (rd *render.Rendered, err error) {
	ref := rc.triggerRef(key)
	owner := ref.Owner()
	existing := rc.childrenOf(owner)

	obj, exists, err := rc.w.trigger.Indexer().GetByKey(key.String())
	if err != nil {
		return nil, err
	}
	var trigger *unstructured.Unstructured
	if exists {
		trigger = wholeOf(obj)
	} else if !rc.w.trigger.HasSynced() {
		// The triggers are still listing (workers start before they
		// have): this one may not have arrived yet. Its Add, or the sweep
		// once the list is complete, queues it again; pruning now could
		// delete the children of a trigger that exists.
		return nil, nil
	}
	ch := &changes{}
	switch {
	case trigger == nil:
		return nil, errors.Join(rc.release(ctx, ch, ref, key, owner, existing), rc.released(ctx, key))
	case trigger.GetDeletionTimestamp() != nil:
		if !rc.finalizes(trigger) {
			return nil, rc.letGo(ctx, ch, ref, key, owner, existing, trigger)
		}
		defer rc.out.reconciled(trigger, ch)
		if rd, err = rc.converge(ctx, ch, ref, key, owner, existing, trigger, true); err != nil || !(rd.Finalized || rd.Skipped) {
			if err == nil && rd.ResyncAfter == 0 {
				rc.later(key, finalizeAgain) // until it answers finalized
			}
			return rd, err
		}
		return rd, rc.letGo(ctx, ch, ref, key, owner, existing, trigger)
	}
	defer rc.out.reconciled(trigger, ch)
	return rc.converge(ctx, ch, ref, key, owner, existing, trigger, false)
}

// finalizeAgain is when a trigger being finalized is reconciled again
// while the rule's finalize function answers it is not done, unless the
// answer says when (resyncAfterSeconds).
const finalizeAgain = 5 * time.Second

// finalizes reports whether trigger, being deleted, is held for the rule's
// finalize function.
func (rc *reconciler) finalizes(trigger *unstructured.Unstructured) bool {
	return rc.rule.Finalizes() && slices.Contains(trigger.GetFinalizers(), rc.rule.TeardownFinalizer())
}

// converge renders the rule for trigger, applying its children, and
// prunes what it no longer wants, writes its status and holds it; while
// finalizing, the rule's finalize function answers instead of its
// function.
func (rc *reconciler) converge(ctx context.Context, ch *changes, ref rules.ObjectRef, key cache.ObjectName, owner string, existing []object, trigger *unstructured.Unstructured, finalizing bool) (*render.Rendered, error) {
	lk := &cacheLookuper{rc: rc, trigger: key}
	ap := &applier{rc: rc, ch: ch, trigger: trigger, key: key, owner: owner,
		desired: map[childRef]bool{}, patched: map[childRef]bool{}, patchKeys: map[depKey]bool{},
		remembered: rememberedOf(trigger, rc.rule.Name), made: createdOnce{}}
	in := rc.renderInput(trigger, lk, ap)
	in.Calls, in.Finalizing, in.DryRun = ap, finalizing, rc.out.dryRun()
	rd, err := render.Rule(ctx, in)
	// What the render read, even when it failed: a source created or
	// fixed later queues the trigger again.
	rc.deps.set(key, lk.queries)
	if err != nil {
		reportPanicIn(klog.FromContext(ctx), rc.metrics, rc.rule.Name, PanicReconcile, err)
		rc.out.failed(trigger, err)
		if rc.rule.WritesStatus() {
			// Keep what the patch index knows: nothing was released.
			return nil, errors.Join(err, rc.writeStatus(ctx, trigger, nil, err))
		}
		return nil, err
	}
	if rd.Skipped {
		return rd, errors.Join(rc.release(ctx, ch, ref, key, owner, existing), rc.remember(ctx, trigger, nil), rc.hold(ctx, key, trigger, false, false))
	}
	errs := rc.conflicts(trigger, rd, ap.errs)
	for _, ce := range rd.Conflicts { // wanted, though not applied: not pruned either
		ap.desired[conflictRef(ce)] = true
	}

	waiting, waitingKinds := rc.waiting(rd, ap)
	if err := rc.prune(ctx, ch, ref, owner, existing, ap.desired, waiting); err != nil {
		errs = append(errs, err)
	}
	if err := rc.pruneRemote(ctx, ch, ref, owner, rd, ap.remote, waiting); err != nil {
		errs = append(errs, err)
	}
	hasChildren := len(ap.desired) > 0 || len(existing) > 0 || len(ap.remote) > 0 || ap.unreachable || rc.remoteChildren(owner)
	if err := errors.Join(rc.releasePatches(ctx, ch, ref, key, ap.patched, waitingKinds), rc.remember(ctx, trigger, ap.createdNow(waiting)),
		rc.hold(ctx, key, trigger, true, hasChildren)); err != nil {
		errs = append(errs, err)
	}
	switch {
	case rd.ResyncAfter > 0:
		rc.later(key, rd.ResyncAfter) // the rule's function asked to be called again
	case ap.unreachable:
		rc.later(key, unreachableAgain) // and when the cluster answers again
	}
	if rc.rule.WritesStatus() {
		if err := rc.writeStatus(ctx, trigger, rd, errors.Join(append(errs, ap.contended...)...)); err != nil {
			rc.out.failed(trigger, err)
			errs = append(errs, err)
		}
	}
	return rd, errors.Join(errs...)
}

// waiting notes the resources of rd that wait for their dependencies —
// their ids, and the kinds of the patches among them — and sets the
// trigger's patch keys: a resource that waits keeps its children as they
// are, neither changed nor pruned nor released.
func (rc *reconciler) waiting(rd *render.Rendered, ap *applier) (map[string]bool, []schema.GroupVersionKind) {
	waiting := map[string]bool{}
	var kinds []schema.GroupVersionKind
	for _, st := range rd.Waiting() {
		waiting[st.Resource.ID] = true
		if st.Resource.Mode == rules.ModePatch {
			kinds = append(kinds, st.Resource.GVK)
			rc.patches.keysOf(ap.key, st.Resource.Index, ap.patchKeys)
		}
		rc.out.wait(ap.trigger, st)
	}
	rc.patches.setKeys(ap.key, ap.patchKeys)
	return waiting, kinds
}

// release lets go of a trigger that wants no children — gone, being
// deleted, or its when is false: its children are pruned and what it
// patched is released, as the rule's deletion policies say.
func (rc *reconciler) release(ctx context.Context, ch *changes, ref rules.ObjectRef, key cache.ObjectName, owner string, existing []object) error {
	rc.deps.set(key, nil)
	rc.patches.setKeys(key, nil)
	rc.writes.forgetConflicts(key)
	return errors.Join(rc.prune(ctx, ch, ref, owner, existing, nil, nil), rc.pruneRemote(ctx, ch, ref, owner, nil, nil, nil),
		rc.releasePatches(ctx, ch, ref, key, nil, nil))
}

// applier applies the children of one reconcile as the render walks the
// rule's resources in dependency order, and notes what it applied.
type applier struct {
	rc        *reconciler
	ch        *changes
	trigger   *unstructured.Unstructured
	key       cache.ObjectName
	owner     string            // the trigger, as its children's owner annotation says
	desired   map[childRef]bool // owned children rendered
	patched   map[childRef]bool // objects patched
	patchKeys map[depKey]bool
	// remembered are the children of createOnce resources the trigger
	// remembers were made; made those made or found by this reconcile.
	remembered, made createdOnce
	errs             []error
	// contended are children left as another writer keeps them: the
	// trigger's Ready condition says so, the reconcile does not fail.
	contended []error
	// remote are the children applied in other clusters, by cluster;
	// unreachable: some went to a cluster that could not be reached.
	remote      map[string]map[childRef]bool
	unreachable bool
}

var _ render.CallObserver = (*applier)(nil)

// FunctionCalled implements render.CallObserver: a finalize or customize
// function's calls are counted as resource <id>/finalize, <id>/customize.
func (a *applier) FunctionCalled(res *rules.Resource, fn *rules.Function, took time.Duration, err error) {
	result := ResultSuccess
	if err != nil {
		result = ResultError
	}
	a.rc.metrics.FunctionCalled(a.rc.rule.Name, fn.CallID(res), fn.Transport(), result, took)
}

// Apply implements render.Applier.
func (a *applier) Apply(ctx context.Context, child render.Child) (map[string]any, error) {
	rc := a.rc
	ref := refOf(child.Object)
	var out map[string]any
	var err error
	switch {
	case child.Cluster != "":
		out, err = a.applyRemote(ctx, child)
		if errors.As(err, new(*render.UnreachableError)) || errors.As(err, new(*render.HeldError)) {
			return nil, err // the child waits there: not a failure
		}
	case child.Patch:
		a.patched[ref] = true
		a.patchKeys[depKey{lookup: child.Resource.Index, namespace: ref.namespace, name: ref.name}] = true
		out, err = rc.applyPatch(ctx, a.ch, a.trigger, a.key, child)
	default:
		a.desired[ref] = true
		if child.Resource.CreateOnce {
			out, err = a.createOnce(ctx, child)
		} else {
			out, err = rc.applyChild(ctx, a.ch, a.trigger, child)
		}
	}
	if errors.Is(err, render.ErrNotRecreated) {
		return nil, err
	}
	if ce, ok := errors.AsType[*render.ContendedError](err); ok {
		a.contended = append(a.contended, ce) // said when its cooling began; no failure
		return out, err
	}
	if err != nil {
		if _, conflict := errors.AsType[*render.ConflictError](err); !conflict { // reported with the render's conflicts
			rc.out.failed(a.trigger, err)
		}
		a.errs = append(a.errs, err)
	}
	return out, err
}

// Observed implements render.Applier: the child as the caches hold it,
// if it is this trigger's child of this rule.
func (a *applier) Observed(child render.Child) map[string]any {
	if child.Cluster != "" {
		return a.observedRemote(child)
	}
	ref := refOf(child.Object)
	ck := a.rc.w.children[ref.gvk]
	if ck.sub == nil {
		return nil
	}
	obj, ok, _ := ck.sub.Indexer().GetByKey(cacheKey(ref))
	if !ok {
		return nil
	}
	live := wholeOf(obj)
	if !childOf(a.rc.rule.Name, a.owner, live) {
		return nil
	}
	return live.Object
}

// conflicts reports each of the render's conflicts through the writer — a
// Warning Event on the trigger and syncloop_apply_total{action="conflict"},
// or a line of the plan — and returns errs with those that did not come
// from the applier (a child that is what a lookup reads): every conflict
// fails the reconcile, which is retried with backoff (an object may be
// removed or annotated for adoption meanwhile).
func (rc *reconciler) conflicts(trigger *unstructured.Unstructured, rd *render.Rendered, errs []error) []error {
	for _, ce := range rd.Conflicts {
		if !slices.ContainsFunc(errs, func(err error) bool { return errors.Is(err, ce) }) {
			errs = append(errs, ce)
		}
		rc.out.conflict(trigger, ce)
	}
	return errs
}

// childrenOf returns this rule's children of one trigger, from the caches.
func (rc *reconciler) childrenOf(owner string) []object {
	var out []object
	for _, ck := range rc.w.children {
		if ck.sub == nil {
			continue
		}
		objs, _ := ck.sub.Indexer().ByIndex(ownerIndex, ownerKey(rc.rule.Name, owner))
		for _, o := range objs {
			out = append(out, o.(object))
		}
	}
	return out
}

// ruleChildren are all the rule's children in the caches, every
// trigger's.
func (rc *reconciler) ruleChildren() []object {
	var out []object
	for _, ck := range rc.w.children {
		if ck.sub == nil {
			continue
		}
		objs, _ := ck.sub.Indexer().ByIndex(ruleIndex, rc.rule.Name)
		for _, o := range objs {
			out = append(out, o.(object))
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
func (rc *reconciler) applyChild(ctx context.Context, ch *changes, trigger *unstructured.Unstructured, child render.Child) (map[string]any, error) {
	obj := child.Object
	ref := refOf(obj)
	// The kind's informer lists in one namespace (the engine's or a
	// tenant's, or the one the rule names): a child elsewhere it would
	// never see.
	ck := rc.w.children[ref.gvk]
	if ck.ns != "" && ref.namespace != ck.ns {
		why := ": " + rc.w.limit()
		if rc.w.ns == "" {
			why = ", where the rule's " + ref.gvk.Kind + " children are watched"
		}
		return nil, terminal(fmt.Errorf("resource %q: %s %s is outside namespace %q%s", child.ResourceID, ref.gvk.Kind, cacheKey(ref), ck.ns, why))
	}
	hash := contentHash(obj.Object)
	// In place: GetAnnotations and SetAnnotations copy the map twice.
	if err := unstructured.SetNestedField(obj.Object, hash, "metadata", "annotations", rules.AnnotationAppliedHash); err != nil {
		return nil, fmt.Errorf("resource %q: %w", child.ResourceID, err)
	}
	key := cache.ObjectName{Namespace: trigger.GetNamespace(), Name: trigger.GetName()}
	fail := func(what string, err error) error {
		return fmt.Errorf("resource %q: %s %s %s: %w", child.ResourceID, what, ref.gvk.Kind, cacheKey(ref), err)
	}

	existing, err := rc.existing(ctx, ck, ref, key)
	if err != nil {
		return nil, fail("reading", err)
	}
	for {
		action := ActionCreate
		if existing != nil {
			adopt, err := render.Takeover(rc.rule, child, rules.TriggerOf(trigger), existing)
			if err != nil {
				rc.writes.conflict(key, ref, true)
				return nil, err
			}
			if !adopt && rc.upToDate(ref, existing, obj, hash) {
				rc.writes.conflict(key, ref, false)
				rc.metrics.Write(rc.rule.Name, WriteUnchanged)
				if !rc.rule.ReadsLive(child.Resource) {
					return obj.Object, nil // what it applied: the same fields
				}
				return wholeOf(existing).Object, nil
			}
			if !adopt && rules.Annotation(existing, rules.AnnotationAppliedHash) == hash {
				// Drift: the rule wants what it applied, the object changed.
				if ce := rc.repairDrift(ctx, trigger, key, child, ck.mapping); ce != nil {
					return nil, ce
				}
			}
			action = ActionUpdate
			if adopt {
				action = ActionAdopt
			}
		}
		w := &write{kind: writeChild, mapping: ck.mapping, obj: obj, manager: rc.rule.FieldManager(), force: rc.rule.ForceConflicts,
			readsLive: rc.rule.ReadsLive(child.Resource), before: existing, action: action, trigger: rules.RefOf(trigger), key: key, ch: ch}
		if existing == nil {
			obj.SetResourceVersion(createOnlyVersion)
		}
		live, err := rc.out.apply(ctx, w)
		obj.SetResourceVersion("")
		if existing == nil && apierrors.IsConflict(err) {
			// An object the cache does not hold has the child's name:
			// read it, and decide whether it may be written (once: it
			// exists now).
			live, gerr := rc.client.Get(ctx, ck.mapping, ref.namespace, ref.name)
			if gerr != nil {
				return nil, fail("reading", gerr)
			}
			existing = live
			continue
		}
		if err != nil {
			return nil, fail("applying", err)
		}
		rc.writes.conflict(key, ref, false)
		return live, nil
	}
}

// existing is the object under ref's name as far as syncloop can tell
// without a request: its cached child, or nil. The API server is asked
// only when the cache may not know: just after a handover (the replica
// that had the trigger may have made the child a moment ago; see
// handoverVerify), or when the last apply found a conflict there (an
// object the cache cannot hold).
func (rc *reconciler) existing(ctx context.Context, ck *childKind, ref childRef, key cache.ObjectName) (object, error) {
	cachedObj, found, err := ck.sub.Indexer().GetByKey(cacheKey(ref))
	if err != nil {
		return nil, err
	}
	if found {
		return cachedObj.(object), nil
	}
	if !rc.mayLag(key) && !rc.writes.hadConflict(key, ref) {
		return nil, nil
	}
	live, err := rc.client.Get(ctx, ck.mapping, ref.namespace, ref.name)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return live, nil
}

// upToDate reports whether applying desired would change nothing: the
// cached child carries the hash of this desired content, and either is
// still the version our own last apply produced or holds every desired
// field (it was changed by someone else, but not in the fields we own) —
// or the cache still holds the version our last apply of this content
// replaced (it lags: ownWrites.lags).
func (rc *reconciler) upToDate(ref childRef, cached object, desired *unstructured.Unstructured, hash string) bool {
	if rc.writes.lags(ref, cached.GetResourceVersion(), hash) {
		return true
	}
	if rules.Annotation(cached, rules.AnnotationAppliedHash) != hash {
		return false
	}
	return rc.writes.isOwnVersion(ref, cached.GetResourceVersion()) || holds(wholeOf(cached).Object, desired.Object)
}

// childRef names a child object.
type childRef struct {
	gvk       schema.GroupVersionKind
	namespace string
	name      string
}

// conflictRef names the child a conflict left unapplied: wanted, so not
// pruned either.
func conflictRef(ce *render.ConflictError) childRef {
	return childRef{gvk: schema.FromAPIVersionAndKind(ce.Object.APIVersion, ce.Object.Kind), namespace: ce.Object.Namespace, name: ce.Object.Name}
}

func refOf(obj object) childRef {
	return childRef{gvk: obj.GetObjectKind().GroupVersionKind(), namespace: obj.GetNamespace(), name: obj.GetName()}
}

// groupKind is "Kind.group", as Redact wants it.
func groupKind(ref childRef) string { return ref.gvk.Kind + "." + ref.gvk.Group }

func cacheKey(ref childRef) string {
	if ref.namespace == "" {
		return ref.name
	}
	return ref.namespace + "/" + ref.name
}
