package render

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// What makes a rendered template a child: its place (name and
// namespace, checked) and syncloop's marks.

// renderChild renders res's template for act into a child of trigger,
// placed and marked.
func renderChild(ctx context.Context, r *rules.Rule, res *rules.Resource, act *expr.Activation, trigger *unstructured.Unstructured, triggerNamespaced, namespaced bool) (*unstructured.Unstructured, error) {
	v, err := res.Template.Render(ctx, act)
	if err != nil {
		return nil, templateError(r, res.Template, res.ID, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, childError(r, res, "", fmt.Errorf("rendered to %T, want an object", v))
	}
	obj := &unstructured.Unstructured{Object: m}
	if err := checkKind(r, res, obj); err != nil {
		return nil, err
	}
	md, ok := m["metadata"].(map[string]any)
	if !ok {
		return nil, childError(r, res, "metadata", errors.New("must render to a mapping"))
	}
	if err := placeChild(r, res, obj, md, trigger, triggerNamespaced, namespaced); err != nil {
		return nil, err
	}
	if err := markChild(r, res, obj, md, trigger, triggerNamespaced, namespaced); err != nil {
		return nil, err
	}
	return obj, nil
}

// checkKind checks that the child is of a kind res may render: its
// template's, or for a computed one one of those its kinds list.
func checkKind(r *rules.Rule, res *rules.Resource, obj *unstructured.Unstructured) error {
	if !res.Computed() {
		return nil
	}
	apiVersion, _ := obj.Object["apiVersion"].(string)
	kind, _ := obj.Object["kind"].(string)
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil || kind == "" || !res.MayRender(gv.WithKind(kind)) {
		return childError(r, res, "kind", fmt.Errorf("rendered apiVersion %s, kind %s: not among the kinds the resource may make (%s)",
			describe(obj.Object["apiVersion"]), describe(obj.Object["kind"]), res.KindNames()))
	}
	return nil
}

// childError is an error of the child res rendered, at field of its
// template.
func childError(r *rules.Rule, res *rules.Resource, field string, err error) error {
	pos, at := res.Body()
	return &RenderError{Pos: pos, Rule: r.Name, Resource: res.ID, Field: rules.JoinField(at, field), Err: err}
}

// placeChild checks the rendered child's name and namespace, and
// defaults the namespace of a namespaced child to the trigger's: each is
// one segment of a request path, and a tenant rule's child stays in its
// namespace.
func placeChild(r *rules.Rule, res *rules.Resource, obj *unstructured.Unstructured, md map[string]any, trigger *unstructured.Unstructured, triggerNamespaced, namespaced bool) error {
	name, ok := md["name"].(string)
	if !ok || name == "" {
		return childError(r, res, "metadata.name", fmt.Errorf("must render to a non-empty string, rendered %s", describe(md["name"])))
	}
	if err := rules.ValidPathName(name); err != nil {
		return childError(r, res, "metadata.name", err)
	}
	ns, hasNS := md["namespace"]
	nsStr, isStr := ns.(string)
	if hasNS && !isStr {
		return childError(r, res, "metadata.namespace", fmt.Errorf("must render to a string, rendered %s", describe(ns)))
	}
	if nsStr != "" {
		if errs := validation.IsDNS1123Label(nsStr); len(errs) > 0 {
			return childError(r, res, "metadata.namespace", fmt.Errorf("%q is not a namespace: %s", nsStr, strings.Join(errs, "; ")))
		}
	}
	switch {
	case namespaced && nsStr == "" && !triggerNamespaced:
		return childError(r, res, "metadata.namespace", fmt.Errorf("%s is namespaced and the trigger is cluster-scoped: set metadata.namespace", obj.GetKind()))
	case namespaced && nsStr == "":
		obj.SetNamespace(trigger.GetNamespace())
	case !namespaced && nsStr != "":
		return childError(r, res, "metadata.namespace", fmt.Errorf("%s is cluster-scoped: metadata.namespace must be empty, rendered %q", obj.GetKind(), nsStr))
	case !namespaced && hasNS:
		delete(md, "namespace")
	}
	if r.Tenant != "" {
		switch {
		case !namespaced:
			return childError(r, res, "kind", fmt.Errorf("a tenant rule of namespace %q stays in it: %s is cluster-scoped", r.Tenant, obj.GetKind()))
		case obj.GetNamespace() != r.Tenant:
			return childError(r, res, "metadata.namespace", fmt.Errorf("a tenant rule of namespace %q stays in it: rendered %q", r.Tenant, obj.GetNamespace()))
		}
	}
	return nil
}

// markChild gives a child syncloop's labels, annotations and controller
// ownerReference — a patch none of them — after dropping the keys
// syncloop keeps from what the template computed.
func markChild(r *rules.Rule, res *rules.Resource, obj *unstructured.Unstructured, md map[string]any, trigger *unstructured.Unstructured, triggerNamespaced, namespaced bool) error {
	// Copies (a template may set labels to a map it read from the trigger),
	// made once, as the unstructured maps they go into, without the keys
	// syncloop keeps: a trigger's labels copied whole must not carry
	// another installation's, rule's or trigger's marks (nor adoption) onto
	// a child, or onto an object a patch writes.
	labels, err := stringsCopy(md["labels"], 4)
	if err != nil {
		return childError(r, res, "metadata.labels", err)
	}
	ann, err := stringsCopy(md["annotations"], 3) // and the engine's applied hash
	if err != nil {
		return childError(r, res, "metadata.annotations", err)
	}
	if res.Mode == rules.ModePatch {
		// Not syncloop's: no labels, annotations or owner of its own.
		for key, m := range map[string]map[string]any{"labels": labels, "annotations": ann} {
			if _, set := md[key]; set {
				md[key] = m
			}
		}
		return nil
	}

	t := rules.TriggerOf(trigger)
	labels[rules.LabelManagedBy] = rules.ManagedByValue
	labels[rules.LabelRule] = r.Name
	labels[rules.LabelOwnerUID] = t.UID
	if r.Installation != "" {
		labels[rules.LabelInstallation] = r.Installation
	}
	md["labels"] = labels
	ann[rules.AnnotationOwner] = t.Owner()
	ann[rules.AnnotationResourceID] = res.ID
	md["annotations"] = ann

	// Kubernetes allows an ownerReference from a child in the trigger's
	// namespace, or to a cluster-scoped trigger from anything. An orphaned
	// child has none: the garbage collector must leave it too.
	// No ownerReference crosses clusters: a child in another one is
	// syncloop's to delete (its labels say whose it is).
	if res.DeletionPolicy != rules.DeletionOrphan && !res.Targets() && (!triggerNamespaced || (namespaced && obj.GetNamespace() == trigger.GetNamespace())) {
		// What SetOwnerReferences makes of the reference, without its
		// conversion by reflection.
		md["ownerReferences"] = []any{map[string]any{
			"apiVersion": t.APIVersion, "kind": t.Kind, "name": t.Name, "uid": string(trigger.GetUID()), "controller": true,
		}}
	}
	return nil
}

// stringsCopy copies a rendered metadata.labels or .annotations (nil
// when the template set none), but for the keys syncloop keeps
// (rules.IsReservedKey), with room for extra more, or says why it is not
// a map of strings.
func stringsCopy(v any, extra int) (map[string]any, error) {
	if v == nil {
		return make(map[string]any, extra), nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("must be a map of strings, not %T", v)
	}
	out := make(map[string]any, len(m)+extra)
	for k, v := range m {
		if _, ok := v.(string); !ok {
			return nil, errors.New("values must be strings")
		}
		if !rules.IsReservedKey(k) {
			out[k] = v
		}
	}
	return out, nil
}
