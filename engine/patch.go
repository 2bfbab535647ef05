package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// Patches (mode: patch) are applied with one field manager per trigger,
// syncloop/<rule>/<hash of the trigger's namespace/name>: triggers that set
// the same field to the same value share it, and releasing one trigger's
// fields (an empty apply with its manager) leaves the others'. The caches
// keep these managers' managedFields entries — and only theirs — so that
// what a trigger patched is found again after a restart, without labels or
// annotations on objects syncloop does not own.

// patchIndex indexes cached objects by the patch managers that own fields
// of them.
const patchIndex = "syncloop-patch-manager"

func patchIndexFunc(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	var out []string
	for _, e := range m.GetManagedFields() {
		if rules.IsPatchManager(e.Manager) {
			out = append(out, e.Manager)
		}
	}
	return out, nil
}

// patchManagerPrefix is what the patch managers of rule start with.
func patchManagerPrefix(r *rules.Rule) string { return r.FieldManager() + "/" }

// patchManager is the field manager of the patches of trigger key: the
// rule's prefix and the key's digest in hex (the digest sharding hashes, so
// a manager has its trigger's owner).
func patchManager(r *rules.Rule, key cache.ObjectName) string {
	return patchManagerPrefix(r) + fmt.Sprintf("%016x", TriggerDigest(key))
}

// managerDigest is the trigger digest a patch manager of prefix names.
func managerDigest(manager, prefix string) (uint64, bool) {
	d, err := strconv.ParseUint(strings.TrimPrefix(manager, prefix), 16, 64)
	return d, err == nil
}

// applyPatch applies a patch child onto the object it names, if that
// exists: otherwise the resource waits (the object's appearance queues the
// trigger again). It never creates: the apply carries the cached object's
// UID as a precondition (applyFresh). It returns the object as it now is
// (when the rule reads it; otherwise what was applied), nil while it waits.
func (rc *reconciler) applyPatch(ctx context.Context, ch *changes, trigger *unstructured.Unstructured, key cache.ObjectName, child render.Child) (map[string]any, error) {
	res := child.Resource
	pw := rc.w.patchWatchOf(res)
	obj := child.Object
	ref := refOf(obj)
	if ns := rc.w.ns; ns != "" && ref.namespace != ns && namespaced(pw.mapping) {
		return nil, terminal(fmt.Errorf("resource %q: %s %s is outside namespace %q: %s", child.ResourceID, ref.gvk.Kind, cacheKey(ref), ns, rc.w.limit()))
	}
	// Recorded before the cache is read: an event after the read finds it.
	rc.patches.addKey(key, depKey{lookup: res.Index, namespace: ref.namespace, name: ref.name}, nil)
	cachedObj, found, err := pw.sub.Indexer().GetByKey(cacheKey(ref))
	if err != nil {
		return nil, err
	}
	if !found {
		klog.FromContext(ctx).V(1).Info("Waiting for an object to patch", "resource", child.ResourceID, "kind", ref.gvk.Kind, "object", cacheKey(ref))
		return nil, nil
	}
	cached := wholeOf(cachedObj)
	manager := patchManager(rc.rule, key)
	if patchUpToDate(cached, obj, manager) {
		rc.metrics.Write(rc.rule.Name, WriteUnchanged)
		return cached.Object, nil
	}
	w := &write{kind: writePatch, mapping: pw.mapping, obj: obj, manager: manager, force: rc.rule.ForceConflicts,
		readsLive: rc.rule.ReadsLive(res), before: cached, action: ActionUpdate, trigger: rules.RefOf(trigger), key: key, ch: ch}
	live, err := rc.applyFresh(ctx, w, func(fresh *unstructured.Unstructured) bool { return patchUpToDate(fresh, obj, manager) })
	switch {
	case err != nil:
		return nil, fmt.Errorf("resource %q: patching %s %s: %w", child.ResourceID, ref.gvk.Kind, cacheKey(ref), err)
	case live == nil: // gone since the cache saw it: its deletion's event queues the trigger
		return nil, nil
	}
	return live, nil
}

// conflictRetries is how many times a write to an object syncloop does
// not own is made again on a fresh read after a Conflict.
const conflictRetries = 3

// applyFresh applies w to an object syncloop does not own, with the UID
// it was read with (w.before) as a precondition: the API server refuses
// to create an object for an apply that names a UID, and refuses the
// apply if the object under the name is another. The UID, not the
// resourceVersion: an object other controllers change too (a Namespace,
// a Deployment) is changed between the cache's read and the apply all the
// time, and a version precondition made each such change a Conflict —
// contention reported as a failed reconcile (make demo showed three at
// start). On a Conflict — the object was replaced — it is read anew and,
// unless done says the fresh one needs nothing, applied again, up to
// conflictRetries times; one that persists is the reconcile's error. It
// returns what w.apply does, or nil when the object is gone or done.
func (rc *reconciler) applyFresh(ctx context.Context, w *write, done func(fresh *unstructured.Unstructured) bool) (map[string]any, error) {
	for attempt := 0; ; attempt++ {
		w.obj.SetUID(w.before.GetUID()) // never a create
		live, err := rc.out.apply(ctx, w)
		if !replaced(err) || attempt == conflictRetries {
			return live, err
		}
		fresh, gerr := rc.client.Get(ctx, w.mapping, w.obj.GetNamespace(), w.obj.GetName())
		switch {
		case apierrors.IsNotFound(gerr):
			return nil, nil
		case gerr != nil:
			return nil, err
		case done(fresh):
			return fresh.Object, nil
		}
		klog.FromContext(ctx).V(2).Info("Object replaced since the cache read it: applying to the new one", "kind", w.mapping.GroupVersionKind.Kind, "object", klog.KObj(fresh))
		w.before = fresh
	}
}

// patchUpToDate reports whether applying desired with manager would change
// nothing: cached holds every desired field, manager owns fields of it,
// and owns none that desired no longer sets (a field removed from the
// template, which must be released).
func patchUpToDate(cached, desired *unstructured.Unstructured, manager string) bool {
	if !holds(cached.Object, desired.Object) {
		return false
	}
	for _, e := range cached.GetManagedFields() {
		if e.Manager != manager || e.Operation != metav1.ManagedFieldsOperationApply || e.FieldsV1 == nil {
			continue
		}
		var set fieldpath.Set
		if err := set.FromJSON(e.FieldsV1.GetRawReader()); err != nil {
			return false
		}
		stale := false
		set.Leaves().Iterate(func(p fieldpath.Path) {
			if !stale && !setsPath(desired.Object, p) {
				stale = true
			}
		})
		return !stale
	}
	return false
}

// setsPath reports whether desired sets the field at p. Within a list the
// whole list stands for its items: desired applies lists whole.
func setsPath(desired map[string]any, p fieldpath.Path) bool {
	var v any = desired
	for _, pe := range p {
		if pe.FieldName == nil {
			return true // a list item: the list is set
		}
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = m[*pe.FieldName]; !ok {
			return false
		}
	}
	return true
}

// patchedBy lists the objects in the patch caches that manager owns fields
// of, once each.
func (rc *reconciler) patchedBy(manager string) []*unstructured.Unstructured {
	seen := map[childRef]bool{}
	var out []*unstructured.Unstructured
	for _, pw := range rc.w.patches {
		if pw.sub == nil {
			continue
		}
		objs, _ := pw.sub.Indexer().ByIndex(patchIndex, manager)
		for _, o := range objs {
			u := wholeOf(o)
			if ref := refOf(u); !seen[ref] {
				seen[ref] = true
				out = append(out, u)
			}
		}
	}
	return out
}

// releasePatches releases the fields trigger key's manager owns on every
// object not in desired (all of them when desired is nil — unless the rule
// orphans). Released objects stay: only fields that manager alone owned
// disappear.
func (rc *reconciler) releasePatches(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, key cache.ObjectName, desired map[childRef]bool, keepKinds []schema.GroupVersionKind) error {
	if len(rc.w.patches) == 0 || (desired == nil && rc.rule.DeletionPolicy == rules.DeletionOrphan && !rc.anyDeletes()) {
		return nil
	}
	manager := patchManager(rc.rule, key)
	var errs []error
	for _, obj := range rc.patchedBy(manager) {
		gvk := refOf(obj).gvk
		if desired[refOf(obj)] || slices.Contains(keepKinds, gvk) || (desired == nil && rc.orphansKind(gvk)) {
			continue
		}
		if err := rc.releaseFields(ctx, ch, triggerRef, obj, manager); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// orphansKind reports whether a trigger that is gone (or whose when is
// false) leaves the fields patched into objects of kind gvk: every patch
// resource of that kind has deletionPolicy Orphan.
func (rc *reconciler) orphansKind(gvk schema.GroupVersionKind) bool {
	found := false
	for _, res := range rc.rule.Resources {
		if res.Mode == rules.ModePatch && res.GVK == gvk {
			if res.DeletionPolicy != rules.DeletionOrphan {
				return false
			}
			found = true
		}
	}
	return found || rc.rule.DeletionPolicy == rules.DeletionOrphan
}

// anyDeletes reports whether some resource of the rule deletes (or
// releases) when its trigger is gone.
func (rc *reconciler) anyDeletes() bool {
	for _, res := range rc.rule.Resources {
		if res.DeletionPolicy == rules.DeletionDelete {
			return true
		}
	}
	return false
}

// releaseFields applies an empty configuration to obj with manager, so
// that the fields only it owned disappear; the UID precondition makes
// sure the object is not recreated.
func (rc *reconciler) releaseFields(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, obj *unstructured.Unstructured, manager string) error {
	m := rc.w.patchMappingOf(obj.GroupVersionKind())
	if m == nil {
		return nil
	}
	ref := refOf(obj)
	empty := &unstructured.Unstructured{Object: map[string]any{"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind()}}
	empty.SetName(obj.GetName())
	empty.SetNamespace(obj.GetNamespace())
	_, err := rc.applyFresh(ctx, &write{kind: writeRelease, mapping: m, obj: empty, manager: manager,
		before: obj, action: ActionUpdate, trigger: triggerRef, ch: ch}, func(fresh *unstructured.Unstructured) bool { return !managesFields(fresh, manager) })
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing the fields of %s %s: %w", ref.gvk.Kind, cacheKey(ref), err)
	}
	return nil
}

// replaced reports whether an apply with a UID precondition was refused
// because the object under its name is another: a Conflict, or the
// Invalid "metadata.uid: field is immutable" the API server answers when
// the apply names another object's UID.
func replaced(err error) bool {
	if apierrors.IsConflict(err) {
		return true
	}
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	return slices.ContainsFunc(status.Status().Details.Causes, func(c metav1.StatusCause) bool { return c.Field == "metadata.uid" })
}

// managesFields reports whether manager owns fields of obj.
func managesFields(obj *unstructured.Unstructured, manager string) bool {
	return slices.ContainsFunc(obj.GetManagedFields(), func(e metav1.ManagedFieldsEntry) bool { return e.Manager == manager })
}

// goneManagers are the patch managers of this rule's triggers that are
// not in the cache: triggers deleted while syncloop was down, whose
// fields the sweep releases. None when the rule orphans.
func (rc *reconciler) goneManagers() []string {
	if len(rc.w.patches) == 0 || rc.rule.DeletionPolicy == rules.DeletionOrphan {
		return nil
	}
	live := map[string]bool{}
	for _, k := range rc.w.trigger.Indexer().ListKeys() {
		if name, err := cache.ParseObjectName(k); err == nil {
			live[patchManager(rc.rule, name)] = true
		}
	}
	prefix := patchManagerPrefix(rc.rule)
	var out []string
	for _, pw := range rc.w.patches {
		if pw.sub == nil {
			continue
		}
		for _, manager := range pw.sub.Indexer().ListIndexFuncValues(patchIndex) {
			if strings.HasPrefix(manager, prefix) && !live[manager] && !slices.Contains(out, manager) {
				out = append(out, manager)
			}
		}
	}
	return out
}

// releaseAll releases the fields manager owns on every object it patched.
func (rc *reconciler) releaseAll(ctx context.Context, manager string) error {
	var errs []error
	for _, obj := range rc.patchedBy(manager) {
		errs = append(errs, rc.releaseFields(ctx, &changes{}, rules.ObjectRef{}, obj, manager))
	}
	return errors.Join(errs...)
}
