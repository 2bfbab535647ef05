package render

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// LookupQuery is a lookup resolved for one trigger: what to read.
type LookupQuery struct {
	Lookup *rules.Lookup
	// Namespace is empty for a cluster-scoped kind and for a list over
	// all namespaces.
	Namespace string
	// Name is empty for a list.
	Name string
	// Selector selects a list's objects; never nil (labels.Everything()).
	Selector labels.Selector
}

// Lookuper reads looked-up objects: the engine from its informer caches,
// offline rendering from the objects it was given. What it returns is
// only read, never modified.
type Lookuper interface {
	// rules.Lookup returns the object named by q (none or one) or the objects
	// of q's list, in any order.
	Lookup(ctx context.Context, q LookupQuery) ([]*unstructured.Unstructured, error)
}

// value is the text's value for the evaluation act.
func textValue(ctx context.Context, r *rules.Rule, t rules.Text, act *expr.Activation) (string, error) {
	if t.Template == nil {
		return t.Literal, nil
	}
	v, err := t.Template.Render(ctx, act)
	if err != nil {
		return "", templateError(r, t.Template, "", err)
	}
	s, ok := v.(string)
	if !ok {
		return "", &RenderError{Pos: t.Template.Pos, Rule: r.Name, Field: t.Template.Field, Err: fmt.Errorf("rendered %s, want a string", describe(v))}
	}
	return s, nil
}

// query resolves the lookup for the evaluation act (its object is the
// trigger): a name, namespace and selector. namespaced says whether the
// kind is namespaced.
func query(ctx context.Context, r *rules.Rule, l *rules.Lookup, act *expr.Activation, trigger *unstructured.Unstructured, namespaced bool) (LookupQuery, error) {
	fail := func(field string, err error) error {
		return &RenderError{Pos: l.Pos, Rule: r.Name, Field: rules.JoinField(l.Field, field), Err: err}
	}
	q := LookupQuery{Lookup: l, Selector: labels.Everything()}
	var err error
	if q.Namespace, err = textValue(ctx, r, l.Namespace, act); err != nil {
		return q, err
	}
	if q.Name, err = textValue(ctx, r, l.Name, act); err != nil {
		return q, err
	}
	if !l.List() && q.Name == "" {
		return q, fail("name", fmt.Errorf("rendered an empty name"))
	}
	sel, err := textValue(ctx, r, l.LabelSelector, act)
	if err != nil {
		return q, err
	}
	if q.Selector, err = labels.Parse(sel); err != nil {
		return q, fail("labelSelector", fmt.Errorf("%q: %w", sel, err))
	}
	switch {
	case !namespaced && q.Namespace != "":
		return q, fail("namespace", fmt.Errorf("%s is cluster-scoped: namespace must be empty, rendered %q", l.Kind, q.Namespace))
	case namespaced && q.Namespace == "" && !l.List():
		if q.Namespace = trigger.GetNamespace(); q.Namespace == "" {
			return q, fail("namespace", fmt.Errorf("%s is namespaced and the trigger is cluster-scoped: set namespace", l.Kind))
		}
	case q.Namespace != "":
		if errs := validation.IsDNS1123Label(q.Namespace); len(errs) > 0 {
			return q, fail("namespace", fmt.Errorf("rendered %q, not a namespace: %s", q.Namespace, strings.Join(errs, "; ")))
		}
	}
	if r.Tenant != "" {
		switch {
		case !namespaced:
			return q, fail("kind", fmt.Errorf("a tenant rule of namespace %q stays in it: %s is cluster-scoped", r.Tenant, l.Kind))
		case q.Namespace == "": // a list: in the tenant's namespace
			q.Namespace = r.Tenant
		case q.Namespace != r.Tenant:
			return q, fail("namespace", fmt.Errorf("a tenant rule of namespace %q stays in it: rendered %q", r.Tenant, q.Namespace))
		}
	}
	return q, nil
}

// lookups resolves and reads the rule's lookups for act: lookups.<id> is
// the object (nil when absent) or the list, sorted by namespace and name.
// It also returns what they read.
func readLookups(ctx context.Context, r *rules.Rule, act *expr.Activation, trigger *unstructured.Unstructured, scoper Scoper, lk Lookuper) (map[string]any, lookupReads, error) {
	out := make(map[string]any, len(r.Lookups))
	act.Lookups = out // a lookup reads the ones before it in LookupOrder
	reads := lookupReads{objects: map[readKey]lookupRead{}, queries: map[string]LookupQuery{}}
	for _, l := range r.LookupOrder {
		namespaced, err := scoper.Namespaced(l.GVK)
		if err != nil {
			return nil, lookupReads{}, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: err}
		}
		q, err := query(ctx, r, l, act, trigger, namespaced)
		if err != nil {
			return nil, lookupReads{}, err
		}
		if lk == nil {
			return nil, lookupReads{}, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: fmt.Errorf("no objects to look up %s in", l.Kind)}
		}
		objs, err := lk.Lookup(ctx, q)
		if err != nil {
			return nil, lookupReads{}, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: err}
		}
		reads.queries[l.ID] = q
		if !l.List() {
			reads.objects[readKey{l.GVK.Group, l.Kind, q.Namespace, q.Name}] = lookupRead{lookup: l}
			if len(objs) == 0 {
				out[l.ID] = nil
			} else {
				out[l.ID] = objs[0].Object
			}
			continue
		}
		objs = slices.Clone(objs)
		slices.SortFunc(objs, func(a, b *unstructured.Unstructured) int {
			return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
		})
		list := make([]any, len(objs))
		for i, o := range objs {
			list[i] = o.Object
			k := readKey{l.GVK.Group, l.Kind, o.GetNamespace(), o.GetName()}
			if _, named := reads.objects[k]; !named {
				reads.objects[k] = lookupRead{lookup: l, listed: o}
			}
		}
		out[l.ID] = list
	}
	return out, reads, nil
}

// lookupReads are what one trigger's lookups read: every object a lookup
// names, present or not, every object a list gave, and each lookup's
// query.
type lookupReads struct {
	objects map[readKey]lookupRead
	queries map[string]LookupQuery // by lookup id
}

type readKey struct{ group, kind, namespace, name string }

type lookupRead struct {
	lookup *rules.Lookup
	// listed is the object a list gave; nil for a lookup by name.
	listed *unstructured.Unstructured
}

// conflict reports a child that is what one of trigger t's lookups reads: a
// rule never writes what it reads — whatever adopt says — or a copy of an
// object into its own namespace would overwrite, then delete, its source.
// An object a list gave that is already this trigger's child is not a
// conflict: a list may select the children it leads to.
func (reads lookupReads) conflict(r *rules.Rule, c Child, t rules.Trigger) error {
	gvk := c.Object.GroupVersionKind()
	read, ok := reads.objects[readKey{gvk.Group, gvk.Kind, c.Object.GetNamespace(), c.Object.GetName()}]
	if !ok || (read.listed != nil && OwnershipOf(r, read.listed, t) == Owned) {
		return nil
	}
	return &ConflictError{Rule: r.Name, Resource: c.ResourceID, Object: rules.RefOf(c.Object),
		Why: fmt.Sprintf("is the object lookup %q reads", read.lookup.ID)}
}

// absentRequired are the required lookups whose object is absent (a list:
// empty), in the order they are read, with what they asked.
func absentRequired(r *rules.Rule, values map[string]any, reads lookupReads) []LookupQuery {
	var out []LookupQuery
	for _, l := range r.LookupOrder {
		if !l.Required {
			continue
		}
		if list, isList := values[l.ID].([]any); (isList && len(list) > 0) || (!isList && values[l.ID] != nil) {
			continue
		}
		out = append(out, reads.queries[l.ID])
	}
	return out
}

// waitingFor is the first of the absent lookups that ids names, or nil.
func waitingFor(ids []string, absent []LookupQuery) *LookupQuery {
	for i := range absent {
		if slices.Contains(ids, absent[i].Lookup.ID) {
			return &absent[i]
		}
	}
	return nil
}

// absence says what is missing: "Secret ns/name does not exist", "no
// Secret in ns matches team=a".
func (q LookupQuery) absence() string {
	l := q.Lookup
	if !l.List() {
		return fmt.Sprintf("%s %s does not exist", l.Kind, strings.TrimPrefix(q.Namespace+"/"+q.Name, "/"))
	}
	where := "in any namespace"
	if q.Namespace != "" {
		where = "in " + q.Namespace
	}
	sel := "matches " + q.Selector.String()
	if q.Selector.Empty() {
		sel = "exists"
	}
	return fmt.Sprintf("no %s %s %s", l.Kind, where, sel)
}

// Objects answers Lookuper from the objects given to an offline render: lookups read them as they would the cluster's.
type Objects []*unstructured.Unstructured

// Clusters implements ClusterLister: offline, the clusters are the
// kubeconfig Secrets among the objects (rules.ClustersOf).
func (o Objects) Clusters() []rules.Cluster { return rules.ClustersOf(o) }

// Lookup implements Lookuper. Objects of the lookup's group and kind match
// whatever their version, as the API server would serve them converted.
func (o Objects) Lookup(_ context.Context, q LookupQuery) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	gk := q.Lookup.GVK.GroupKind()
	for _, obj := range o {
		if obj.GroupVersionKind().GroupKind() != gk || (q.Namespace != "" && obj.GetNamespace() != q.Namespace) {
			continue
		}
		if q.Name != "" {
			if obj.GetName() == q.Name {
				return []*unstructured.Unstructured{obj}, nil
			}
			continue
		}
		if q.Selector.Matches(rules.Labels(obj)) {
			out = append(out, obj)
		}
	}
	return out, nil
}
