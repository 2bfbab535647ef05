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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
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

// patchWatch is the informer of a mode: patch resource: the objects it may
// patch, with the patch managers' managedFields. res is nil for a watch an
// earlier version of the rule had: kept only to release what it patched.
type patchWatch struct {
	res     *rules.Resource
	key     dynamic.WatchKey
	mapping *meta.RESTMapping
	sub     *dynamic.Subscription
}

// patchWatchKey narrows a patch resource's watch to what its template says
// literally: the namespace, and the name. Patched objects carry no label
// of syncloop's to select them by.
func (c *controller) patchWatchKey(res *rules.Resource, m *meta.RESTMapping) dynamic.WatchKey {
	return c.narrowWatch(m, res.LiteralNamespace, res.LiteralName, "")
}

// subscribePatches starts (or shares) the patch informers; an event on a
// patched object queues the triggers that want to patch it.
func (c *controller) subscribePatches(ctx context.Context) error {
	keys := map[dynamic.WatchKey]bool{}
	for _, pw := range c.patches {
		keys[pw.key] = true
		changed := func(objs ...any) {
			if pw.res != nil {
				c.patchChanged(pw.res.Index, objs...)
			}
		}
		sub, err := c.e.registry.Subscribe(ctx, pw.key, cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { changed(obj) },
			UpdateFunc: func(old, obj any) { changed(obj) },
			DeleteFunc: func(obj any) { c.forget(obj); changed(obj) },
		})
		if err != nil && pw.res == nil {
			continue // best effort, as for retired child kinds
		}
		if err != nil {
			return err
		}
		pw.sub = sub
	}
	return nil
}

// patchChanged queues the triggers whose resource number i patches obj —
// unless the event is the echo of syncloop's own last apply of it.
func (c *controller) patchChanged(i int, objs ...any) {
	for _, obj := range objs {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if c.writes.isOwnVersion(refOf(u), u.GetResourceVersion()) {
			continue
		}
		c.patchDeps.each(i, u.GetNamespace(), u.GetName(), labels.Set(nil), c.add)
	}
}

func (c *controller) patchWatchOf(res *rules.Resource) *patchWatch {
	for _, pw := range c.patches {
		if pw.res == res {
			return pw
		}
	}
	panic(fmt.Sprintf("resource %q of rule %q has no patch watch", res.ID, c.rule.Name))
}

// applyPatch applies a patch child onto the object it names, if that
// exists: otherwise the resource waits (the object's appearance queues the
// trigger again). It never creates: the apply carries the cached
// resourceVersion as a precondition. It returns the object as it now is
// (when the rule reads it; otherwise what was applied), nil while it waits.
func (c *controller) applyPatch(ctx context.Context, ch *changes, trigger *unstructured.Unstructured, key cache.ObjectName, child rules.Child) (map[string]any, error) {
	res := child.Resource
	pw := c.patchWatchOf(res)
	obj := child.Object
	ref := refOf(obj)
	if c.e.ns != "" && ref.namespace != c.e.ns && pw.mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return nil, fmt.Errorf("resource %q: %s %s is outside namespace %q, to which syncloop is limited (--watch-namespace)", child.ResourceID, ref.gvk.Kind, cacheKey(ref), c.e.ns)
	}
	// Recorded before the cache is read: an event after the read finds it.
	c.patchDeps.addKey(key, depKey{lookup: res.Index, namespace: ref.namespace, name: ref.name}, nil)
	cachedObj, found, err := pw.sub.Indexer().GetByKey(cacheKey(ref))
	if err != nil {
		return nil, err
	}
	if !found {
		klog.FromContext(ctx).V(1).Info("Waiting for an object to patch", "resource", child.ResourceID, "kind", ref.gvk.Kind, "object", cacheKey(ref))
		return nil, nil
	}
	cached := cachedObj.(*unstructured.Unstructured)
	manager := patchManager(c.rule, key)
	if patchUpToDate(cached, obj, manager) {
		c.e.metrics.Write(c.rule.Name, "unchanged")
		return cached.Object, nil
	}
	obj.SetResourceVersion(cached.GetResourceVersion()) // never a create
	if c.e.plan != nil {
		out, err := c.e.writer.Apply(ctx, pw.mapping, obj, manager, c.rule.ForceConflicts)
		if err != nil {
			return nil, fmt.Errorf("resource %q: patching %s %s: %w", child.ResourceID, ref.gvk.Kind, cacheKey(ref), err)
		}
		if diff := diffObjects(groupKind(ref), cached.Object, out.Object, obj.Object); diff != "" {
			c.e.plan.Plan(Action{Action: ActionUpdate, Rule: c.rule.Name, Trigger: rules.RefOf(trigger), Object: rules.RefOf(obj), Diff: diff})
		}
		return out.Object, nil
	}
	live := obj.Object // stands for the object when the rule does not read it
	var rv string
	if c.rule.ReadsLive(res) {
		out, err := c.e.writer.Apply(ctx, pw.mapping, obj, manager, c.rule.ForceConflicts)
		if err == nil {
			live, rv = out.Object, out.GetResourceVersion()
		}
	} else {
		rv, err = c.e.writer.ApplyVersion(ctx, pw.mapping, obj, manager, c.rule.ForceConflicts)
	}
	if err != nil {
		return nil, fmt.Errorf("resource %q: patching %s %s: %w", child.ResourceID, ref.gvk.Kind, cacheKey(ref), err)
	}
	c.writes.remember(ref, rv)
	c.e.metrics.Write(c.rule.Name, "update")
	klog.FromContext(ctx).V(2).Info("Patched object", "kind", ref.gvk.Kind, "object", klog.KObj(obj))
	ch.applied = append(ch.applied, fmt.Sprintf("Patched %s %s", ref.gvk.Kind, cacheKey(ref)))
	return live, nil
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
		if err := set.FromJSON(strings.NewReader(string(e.FieldsV1.Raw))); err != nil {
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
func (c *controller) patchedBy(manager string) []*unstructured.Unstructured {
	seen := map[childRef]bool{}
	var out []*unstructured.Unstructured
	for _, pw := range c.patches {
		if pw.sub == nil {
			continue
		}
		objs, _ := pw.sub.Indexer().ByIndex(patchIndex, manager)
		for _, o := range objs {
			u := o.(*unstructured.Unstructured)
			if ref := refOf(u); !seen[ref] {
				seen[ref] = true
				out = append(out, u)
			}
		}
	}
	return out
}

// mappingOf returns the mapping of a patch watch for obj's kind.
func (c *controller) patchMappingOf(obj *unstructured.Unstructured) *meta.RESTMapping {
	for _, pw := range c.patches {
		if pw.mapping.GroupVersionKind == obj.GroupVersionKind() {
			return pw.mapping
		}
	}
	return nil
}

// releasePatches releases the fields trigger key's manager owns on every
// object not in desired (all of them when desired is nil — unless the rule
// orphans). Released objects stay: only fields that manager alone owned
// disappear.
func (c *controller) releasePatches(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, key cache.ObjectName, desired map[childRef]bool, keepKinds []schema.GroupVersionKind) error {
	if len(c.patches) == 0 || (desired == nil && c.rule.DeletionPolicy == rules.DeletionOrphan && !c.anyDeletes()) {
		return nil
	}
	var errs []error
	for _, obj := range c.patchedBy(patchManager(c.rule, key)) {
		if desired[refOf(obj)] || slices.Contains(keepKinds, refOf(obj).gvk) {
			continue
		}
		if desired == nil && c.orphansKind(refOf(obj).gvk) {
			continue
		}
		if err := c.release(ctx, ch, triggerRef, obj, patchManager(c.rule, key)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// keepPatchKeys adds to keys what the trigger already depends on through
// the patch resource res, which waits: its object's appearance or change
// still queues the trigger.
func (c *controller) keepPatchKeys(key cache.ObjectName, res *rules.Resource, keys map[depKey]bool) {
	c.patchDeps.keysOf(key, res.Index, keys)
}

// orphansKind reports whether a trigger that is gone (or whose when is
// false) leaves the fields patched into objects of kind gvk: every patch
// resource of that kind has deletionPolicy Orphan.
func (c *controller) orphansKind(gvk schema.GroupVersionKind) bool {
	found := false
	for _, res := range c.rule.Resources {
		if res.Mode == rules.ModePatch && res.GVK == gvk {
			if res.DeletionPolicy != rules.DeletionOrphan {
				return false
			}
			found = true
		}
	}
	return found || c.rule.DeletionPolicy == rules.DeletionOrphan
}

// anyDeletes reports whether some resource of the rule deletes (or
// releases) when its trigger is gone.
func (c *controller) anyDeletes() bool {
	for _, res := range c.rule.Resources {
		if res.DeletionPolicy == rules.DeletionDelete {
			return true
		}
	}
	return false
}

// release applies an empty configuration to obj with manager, so that the
// fields only it owned disappear; the resourceVersion precondition makes
// sure the object is not recreated.
func (c *controller) release(ctx context.Context, ch *changes, triggerRef rules.ObjectRef, obj *unstructured.Unstructured, manager string) error {
	m := c.patchMappingOf(obj)
	if m == nil {
		return nil
	}
	ref := refOf(obj)
	empty := &unstructured.Unstructured{Object: map[string]any{"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind()}}
	empty.SetName(obj.GetName())
	empty.SetNamespace(obj.GetNamespace())
	empty.SetResourceVersion(obj.GetResourceVersion())
	if c.e.plan != nil {
		out, err := c.e.writer.Apply(ctx, m, empty, manager, false)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing the fields of %s %s: %w", ref.gvk.Kind, cacheKey(ref), err)
		}
		if err == nil {
			if diff := diffObjects(groupKind(ref), obj.Object, out.Object, obj.Object); diff != "" {
				c.e.plan.Plan(Action{Action: ActionUpdate, Rule: c.rule.Name, Trigger: triggerRef, Object: rules.RefOf(obj), Diff: diff})
			}
		}
		return nil
	}
	rv, err := c.e.writer.ApplyVersion(ctx, m, empty, manager, false)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("releasing the fields of %s %s: %w", ref.gvk.Kind, cacheKey(ref), err)
	}
	c.writes.remember(ref, rv)
	c.e.metrics.Write(c.rule.Name, "update")
	klog.FromContext(ctx).V(2).Info("Released the fields of an object", "kind", ref.gvk.Kind, "object", klog.KObj(obj))
	ch.pruned = append(ch.pruned, fmt.Sprintf("Released %s %s", ref.gvk.Kind, cacheKey(ref)))
	return nil
}

// sweepPatches releases what the patch managers of triggers that no
// longer exist own: triggers deleted while syncloop was down.
func (c *controller) sweepPatches(ctx context.Context) {
	if len(c.patches) == 0 || c.rule.DeletionPolicy == rules.DeletionOrphan {
		return
	}
	live := map[string]bool{}
	for _, k := range c.trigger.Indexer().ListKeys() {
		if name, err := cache.ParseObjectName(k); err == nil {
			live[patchManager(c.rule, name)] = true
		}
	}
	prefix := patchManagerPrefix(c.rule)
	done := map[string]bool{}
	for _, pw := range c.patches {
		if pw.sub == nil {
			continue
		}
		for _, manager := range pw.sub.Indexer().ListIndexFuncValues(patchIndex) {
			if !strings.HasPrefix(manager, prefix) || live[manager] || done[manager] {
				continue
			}
			done[manager] = true
			if err := c.releaseGone(ctx, manager, prefix); err != nil {
				klog.FromContext(ctx).Error(err, "Releasing the fields of a trigger that is gone")
			}
		}
	}
}

// releaseGone releases what manager, of a trigger that is gone, patched —
// if this replica owns that trigger (sharding), as work on it that a
// handover waits for.
func (c *controller) releaseGone(ctx context.Context, manager, prefix string) error {
	d, ok := managerDigest(manager, prefix)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !c.begin(d, cancel) {
		return nil // another replica's to release
	}
	defer c.end(d)
	var errs []error
	for _, obj := range c.patchedBy(manager) {
		errs = append(errs, c.release(ctx, &changes{}, rules.ObjectRef{}, obj, manager))
	}
	return errors.Join(errs...)
}

// afterRetiredPatches queues every trigger once the patch watches of the
// rule's earlier versions have synced (the rule does not wait for them: a
// kind may be gone): each reconcile then releases what its trigger patched
// through a resource the rule no longer has.
func (c *controller) afterRetiredPatches(ctx context.Context) {
	n := 0
	for _, pw := range c.patches {
		if pw.res == nil && pw.sub != nil {
			if !pw.sub.WaitForSync(ctx) {
				return
			}
			n++
		}
	}
	if n == 0 || !c.trigger.WaitForSync(ctx) {
		return
	}
	for _, k := range c.trigger.Indexer().ListKeys() {
		if name, err := cache.ParseObjectName(k); err == nil {
			c.add(name)
		}
	}
}
