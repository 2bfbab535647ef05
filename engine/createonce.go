package engine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// A createOnce resource's children are made once (Kyverno's synchronize:
// false): created when absent, then never updated — the template's or
// the trigger's changes do not reach them, drift is not repaired — and
// not created again once deleted while the trigger still renders them.
// What was made is remembered on the trigger, in the annotation
// rules.CreatedOnceKey(rule): one entry a child, "<resource id>/<Kind.
// group>/<namespace>/<name>", kept while the trigger renders the child
// (or its resource waits); one it no longer renders is forgotten, so a
// child wanted again later is created again, once.

// createdOnce is a set of remembered entries.
type createdOnce map[string]bool

// createdEntry is child's entry in the trigger's memory.
func createdEntry(child render.Child) string {
	ref := refOf(child.Object)
	return child.ResourceID + "/" + groupKind(ref) + "/" + ref.namespace + "/" + ref.name
}

// rememberedOf is what trigger's annotation remembers for rule.
func rememberedOf(trigger *unstructured.Unstructured, rule string) createdOnce {
	out := createdOnce{}
	if trigger == nil {
		return out
	}
	for _, e := range strings.Split(rules.Annotation(trigger, rules.CreatedOnceKey(rule)), "\n") {
		if e != "" {
			out[e] = true
		}
	}
	return out
}

// String is the annotation's value: the entries, sorted, a line each.
func (c createdOnce) String() string {
	return strings.Join(slices.Sorted(maps.Keys(c)), "\n")
}

// createOnce applies a child of a createOnce resource: an existing child
// of this trigger is read as it is and left alone, one made before and
// deleted since is render.ErrNotRecreated, and only an absent one never
// made (or an object the rule may adopt) is applied.
func (a *applier) createOnce(ctx context.Context, child render.Child) (map[string]any, error) {
	rc := a.rc
	ref := refOf(child.Object)
	entry := createdEntry(child)
	ck := rc.w.children[ref.gvk]
	if ck.sub != nil {
		existing, err := rc.existing(ctx, ck, ref, a.key)
		if err != nil {
			return nil, fmt.Errorf("resource %q: reading %s %s: %w", child.ResourceID, ref.gvk.Kind, cacheKey(ref), err)
		}
		switch {
		case existing != nil && childOf(rc.rule.Name, a.owner, existing):
			a.made[entry] = true
			rc.metrics.Write(rc.rule.Name, WriteUnchanged)
			return wholeOf(existing).Object, nil
		case existing == nil && a.remembered[entry]:
			a.made[entry] = true
			return nil, render.ErrNotRecreated
		}
	}
	out, err := rc.applyChild(ctx, a.ch, a.trigger, child)
	if err == nil {
		a.made[entry] = true
	}
	return out, err
}

// createdNow is the trigger's memory after a render: the children made
// or found this time, and what it remembered of the resources that wait
// (their children are kept as they are).
func (a *applier) createdNow(waiting map[string]bool) createdOnce {
	out := maps.Clone(a.made)
	for e := range a.remembered {
		if id, _, _ := strings.Cut(e, "/"); waiting[id] {
			out[e] = true
		}
	}
	return out
}

// remember writes what trigger's memory becomes, unless it holds it
// already: its annotation, applied with a field manager of its own, so
// that an empty memory removes it.
func (rc *reconciler) remember(ctx context.Context, trigger *unstructured.Unstructured, now createdOnce) error {
	key := rules.CreatedOnceKey(rc.rule.Name)
	was, had := rules.LookupAnnotation(trigger, key)
	if v := now.String(); v == was && (had || v == "") {
		return nil
	}
	patch := markOf(trigger)
	if len(now) > 0 {
		patch.SetAnnotations(map[string]string{key: now.String()})
	}
	if err := rc.out.mark(ctx, rc.w.triggerMapping, patch, rc.rule.FieldManager()+"/created-once"); err != nil {
		return fmt.Errorf("remembering the children created once (annotation %s): %w", key, err)
	}
	return nil
}

// markOf is the start of an apply of syncloop's marks on trigger: its
// kind, name and UID. The UID makes the apply fail (a Conflict) when the
// trigger is gone meanwhile, where an apply would create it.
func markOf(trigger *unstructured.Unstructured) *unstructured.Unstructured {
	metadata := map[string]any{"name": trigger.GetName(), "uid": string(trigger.GetUID())}
	if ns := trigger.GetNamespace(); ns != "" {
		metadata["namespace"] = ns
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": trigger.GetAPIVersion(), "kind": trigger.GetKind(), "metadata": metadata}}
}
