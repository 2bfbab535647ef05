package rules

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules/expr"
)

// Scoper says whether a kind is namespaced. The engine answers from the
// cluster's RESTMapper; offline rendering from OfflineScope.
type Scoper interface {
	Namespaced(gvk schema.GroupVersionKind) (bool, error)
}

// Child is one rendered child object and the resource that made it.
type Child struct {
	ResourceID string
	// Index is the forEach position, or -1 outside forEach.
	Index  int
	Object *unstructured.Unstructured
	// Resource is the resource that made the child.
	Resource *Resource
	// Patch: the object is not syncloop's; Object holds only the fields
	// to apply onto it, without syncloop's labels and annotations.
	Patch bool
}

// Rendered is the desired state of one trigger under one rule.
type Rendered struct {
	// Skipped is true when the rule's `when` is false for the trigger: it
	// wants no children and writes no status.
	Skipped  bool
	Children []Child

	rule *Rule
	act  *expr.Activation
}

// RenderError is a failure to render a rule for a trigger. It names the
// place in the rule file, the rule, the resource and the field, and wraps
// the cause (errors.Is(err, expr.ErrCostLimit) works through it).
type RenderError struct {
	Pos      Pos
	Rule     string
	Resource string // empty outside a resource
	Field    string
	Err      error
}

func (e *RenderError) Error() string {
	s := ""
	if p := e.Pos.String(); p != "" {
		s = p + ": "
	}
	s += fmt.Sprintf("rule %q: ", e.Rule)
	if e.Resource != "" {
		s += fmt.Sprintf("resource %q: ", e.Resource)
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Err.Error()
}

func (e *RenderError) Unwrap() error { return e.Err }

// Trigger identifies a trigger object the way syncloop's annotations name
// it: apiVersion/kind/namespace/name.
type Trigger struct {
	APIVersion, Kind, Namespace, Name string
	UID                               string
}

// TriggerOf describes obj.
func TriggerOf(obj *unstructured.Unstructured) Trigger {
	return Trigger{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(),
		Name: obj.GetName(), UID: string(obj.GetUID())}
}

// String is the value of the syncloop.dev/owner annotation.
func (t Trigger) String() string {
	return t.APIVersion + "/" + t.Kind + "/" + t.Namespace + "/" + t.Name
}

// MaxChildren bounds the children one trigger may render, over all of a
// rule's resources: a forEach over a list from the trigger must not turn one
// object into a flood of writes.
const MaxChildren = 10_000

// Render computes the children the rule wants for trigger: it evaluates
// `when`, reads the lookups from lk, evaluates the variables, each
// resource's `when` and `forEach`, renders the templates, defaults
// namespaces (scoper says which kinds are namespaced), and adds syncloop's
// labels, annotations and controller ownerReference. It reads nothing but
// its arguments; lk may be nil for a rule without lookups.
func (r *Rule) Render(ctx context.Context, trigger *unstructured.Unstructured, scoper Scoper, lk Lookuper) (*Rendered, error) {
	act := &expr.Activation{Object: trigger.Object, Rule: r.Name, Variables: map[string]any{}}
	if r.When != nil {
		ok, err := r.When.EvalBool(ctx, act)
		if err != nil {
			return nil, r.exprError(r.When, "", err)
		}
		if !ok {
			return &Rendered{Skipped: true, rule: r, act: act}, nil
		}
	}
	if len(r.Lookups) > 0 {
		var err error
		if act.Lookups, err = r.lookups(ctx, act, trigger, scoper, lk); err != nil {
			return nil, err
		}
	}
	for _, v := range r.Variables {
		val, err := v.Expr.Eval(ctx, act)
		if err != nil {
			return nil, r.exprError(v.Expr, "", err)
		}
		act.Variables[v.Name] = val
	}

	triggerNamespaced := trigger.GetNamespace() != ""
	out := &Rendered{rule: r, act: act}
	seen := map[string]string{} // kind/namespace/name → resource id
	for _, res := range r.Resources {
		if res.When != nil {
			ok, err := res.When.EvalBool(ctx, act)
			if err != nil {
				return nil, r.exprError(res.When, res.ID, err)
			}
			if !ok {
				continue
			}
		}
		namespaced, err := scoper.Namespaced(res.GVK)
		if err != nil {
			return nil, &RenderError{Pos: res.Template.Pos, Rule: r.Name, Resource: res.ID, Field: res.Template.Field, Err: err}
		}
		items := []any{nil}
		if res.ForEach != nil {
			items, err = res.ForEach.EvalList(ctx, act)
			if err != nil {
				return nil, r.exprError(res.ForEach, res.ID, err)
			}
			if n := len(out.Children) + len(items); n > MaxChildren {
				return nil, &RenderError{Pos: res.ForEach.Pos, Rule: r.Name, Resource: res.ID, Field: res.ForEach.Field,
					Err: fmt.Errorf("%d children, more than the %d one trigger may have", n, MaxChildren)}
			}
		}
		for i, item := range items {
			index := -1
			itemAct := act
			if res.ForEach != nil {
				index = i
				cp := *act
				cp.Item, cp.Index = item, int64(i)
				itemAct = &cp
			}
			obj, err := r.renderChild(ctx, res, itemAct, trigger, triggerNamespaced, namespaced)
			if err != nil {
				return nil, err
			}
			key := obj.GetKind() + "/" + obj.GetNamespace() + "/" + obj.GetName()
			if prev, dup := seen[key]; dup {
				return nil, &RenderError{Pos: res.Template.Pos, Rule: r.Name, Resource: res.ID, Field: res.Template.Field,
					Err: fmt.Errorf("%s %s rendered twice (also by resource %q)", obj.GetKind(), namespacedName(obj), prev)}
			}
			seen[key] = res.ID
			out.Children = append(out.Children, Child{ResourceID: res.ID, Index: index, Object: obj, Resource: res, Patch: res.Mode == ModePatch})
		}
	}
	return out, nil
}

func (r *Rule) renderChild(ctx context.Context, res *Resource, act *expr.Activation, trigger *unstructured.Unstructured, triggerNamespaced, namespaced bool) (*unstructured.Unstructured, error) {
	fail := func(field string, err error) error {
		return &RenderError{Pos: res.Template.Pos, Rule: r.Name, Resource: res.ID, Field: join(res.Template.Field, field), Err: err}
	}
	v, err := res.Template.Render(ctx, act)
	if err != nil {
		return nil, r.templateError(res.Template, res.ID, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fail("", fmt.Errorf("rendered to %T, want an object", v))
	}
	obj := &unstructured.Unstructured{Object: m}
	md, ok := m["metadata"].(map[string]any)
	if !ok {
		return nil, fail("metadata", errors.New("must render to a mapping"))
	}
	name, ok := md["name"].(string)
	if !ok || name == "" {
		return nil, fail("metadata.name", fmt.Errorf("must render to a non-empty string, rendered %s", describe(md["name"])))
	}
	ns, hasNS := md["namespace"]
	nsStr, isStr := ns.(string)
	if hasNS && !isStr {
		return nil, fail("metadata.namespace", fmt.Errorf("must render to a string, rendered %s", describe(ns)))
	}
	switch {
	case namespaced && nsStr == "" && !triggerNamespaced:
		return nil, fail("metadata.namespace", fmt.Errorf("%s is namespaced and the trigger is cluster-scoped: set metadata.namespace", res.Kind))
	case namespaced && nsStr == "":
		obj.SetNamespace(trigger.GetNamespace())
	case !namespaced && nsStr != "":
		return nil, fail("metadata.namespace", fmt.Errorf("%s is cluster-scoped: metadata.namespace must be empty, rendered %q", res.Kind, nsStr))
	case !namespaced && hasNS:
		delete(md, "namespace")
	}
	if res.Mode == ModePatch {
		return obj, nil // not syncloop's: no labels, annotations or owner
	}

	t := TriggerOf(trigger)
	labels, _, err := unstructured.NestedStringMap(m, "metadata", "labels")
	if err != nil {
		return nil, fail("metadata.labels", errors.New("values must be strings"))
	}
	ann, _, err := unstructured.NestedStringMap(m, "metadata", "annotations")
	if err != nil {
		return nil, fail("metadata.annotations", errors.New("values must be strings"))
	}
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelManagedBy] = ManagedByValue
	labels[LabelRule] = r.Name
	labels[LabelOwnerUID] = t.UID
	obj.SetLabels(labels)
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationOwner] = t.String()
	ann[AnnotationResourceID] = res.ID
	obj.SetAnnotations(ann)

	// Kubernetes allows an ownerReference from a child in the trigger's
	// namespace, or to a cluster-scoped trigger from anything.
	if !triggerNamespaced || (namespaced && obj.GetNamespace() == trigger.GetNamespace()) {
		ctrl := true
		obj.SetOwnerReferences([]metav1.OwnerReference{{
			APIVersion: t.APIVersion, Kind: t.Kind, Name: t.Name, UID: trigger.GetUID(), Controller: &ctrl,
		}})
	}
	return obj, nil
}

// Status renders the rule's status for the trigger, with children.<id> the
// live state of each rendered child as live returns it (a list for forEach
// resources); a child live does not know is left out. It returns nil when
// the rule has no status or the trigger was skipped.
func (rd *Rendered) Status(ctx context.Context, live func(Child) (map[string]any, bool)) (map[string]any, error) {
	r := rd.rule
	if r.Status == nil || rd.Skipped {
		return nil, nil
	}
	children := map[string]any{}
	for _, res := range r.Resources {
		if res.ForEach != nil {
			children[res.ID] = []any{}
		}
	}
	for _, c := range rd.Children {
		obj, ok := live(c)
		if !ok {
			continue
		}
		if c.Index >= 0 {
			children[c.ResourceID] = append(children[c.ResourceID].([]any), obj)
		} else {
			children[c.ResourceID] = obj
		}
	}
	act := *rd.act
	act.Children = children
	v, err := r.Status.Render(ctx, &act)
	if err != nil {
		return nil, r.templateError(r.Status, "", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &RenderError{Pos: r.Status.Pos, Rule: r.Name, Field: r.Status.Field, Err: fmt.Errorf("rendered to %s, want a mapping", describe(v))}
	}
	return m, nil
}

// RenderedObject returns the child's rendered object: the live function for
// Status when there is no cluster.
func RenderedObject(c Child) (map[string]any, bool) { return c.Object.Object, true }

func (r *Rule) exprError(e *Expression, resource string, err error) error {
	return &RenderError{Pos: e.Pos, Rule: r.Name, Resource: resource, Field: e.Field, Err: err}
}

func (r *Rule) templateError(t *Template, resource string, err error) error {
	var re *expr.RenderError
	if errors.As(err, &re) {
		return &RenderError{Pos: t.posOf(re.Path), Rule: r.Name, Resource: resource,
			Field: pathField(t.Field, re.Path), Err: fmt.Errorf("${%s}: %w", re.Expr, re.Err)}
	}
	return &RenderError{Pos: t.Pos, Rule: r.Name, Resource: resource, Field: t.Field, Err: err}
}

func namespacedName(obj *unstructured.Unstructured) string {
	if obj.GetNamespace() == "" {
		return obj.GetName()
	}
	return obj.GetNamespace() + "/" + obj.GetName()
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%q", v)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%v", v)
}
