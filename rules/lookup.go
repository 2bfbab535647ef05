package rules

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules/expr"
)

// LookupQuery is a lookup resolved for one trigger: what to read.
type LookupQuery struct {
	Lookup *Lookup
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
	// Lookup returns the object named by q (none or one) or the objects
	// of q's list, in any order.
	Lookup(ctx context.Context, q LookupQuery) ([]*unstructured.Unstructured, error)
}

// decodeLookups decodes spec.lookups and returns the lookup ids.
func (d *decoder) decodeLookups(r *Rule, n *yaml.Node, c *expr.Compiler, ts *expr.Types) []string {
	var ids []string
	for i, ln := range d.seq(n, "spec.lookups") {
		field := fmt.Sprintf("spec.lookups[%d]", i)
		f := d.fields(ln, field, RuleFormat.known("spec.lookups")...)
		if f == nil {
			continue
		}
		errsBefore := len(d.errs)
		l := &Lookup{Pos: d.pos(resolve(ln)), Field: field, ID: d.id(ln, f, field, "lookup", ids)}
		l.APIVersion, l.Kind = d.apiVersionKind(ln, f, field)
		if gv, err := schema.ParseGroupVersion(l.APIVersion); err == nil {
			l.GVK = gv.WithKind(l.Kind)
		}
		if nn, ok := f["namespace"]; ok {
			l.Namespace = d.text(nn, field+".namespace", c, ts)
			if v := l.Namespace.Literal; l.Namespace.IsLiteral() && v != "" {
				if errs := validation.IsDNS1123Label(v); len(errs) > 0 {
					d.errorf(nn, field+".namespace", "%q is not a valid namespace: %s", v, strings.Join(errs, "; "))
				}
			}
		}
		if nn, ok := f["name"]; ok {
			errs := len(d.errs)
			l.Name = d.text(nn, field+".name", c, ts)
			if l.Name.Empty() && len(d.errs) == errs {
				d.errorf(nn, field+".name", "must not be empty: leave name out for a list")
			}
		}
		if nn, ok := f["labelSelector"]; ok {
			if _, named := f["name"]; named {
				d.errorf(nn, field+".labelSelector", "a lookup by name reads one object: leave name out for a list by labels")
			}
			l.LabelSelector = d.text(nn, field+".labelSelector", c, ts)
			if l.LabelSelector.IsLiteral() {
				if _, err := labels.Parse(l.LabelSelector.Literal); err != nil {
					d.errorf(nn, field+".labelSelector", "%v", err)
				}
			}
		}
		if len(d.errs) == errsBefore && l.ID != "" {
			l.Index = len(r.Lookups)
			r.Lookups = append(r.Lookups, l)
			ids = append(ids, l.ID)
		}
	}
	return ids
}

// text decodes a string field that may hold ${} over the trigger. The
// value of a sole ${expr} must be a string.
func (d *decoder) text(n *yaml.Node, field string, c *expr.Compiler, ts *expr.Types) Text {
	v, ok := d.str(n, field)
	if !ok || !strings.Contains(v, "${") {
		return Text{Literal: v}
	}
	t, err := c.CompileString(v, expr.Scope{Types: ts})
	if err != nil {
		d.errorAt(d.offsetPos(resolve(n), err.Offset), field, "%s", err.Msg)
		return Text{}
	}
	if t.Expressions() == 0 { // only $${ escapes: a literal after all
		s, _ := t.Render(context.Background(), &expr.Activation{})
		lit, _ := s.(string)
		return Text{Literal: lit}
	}
	return Text{Template: &Template{Template: t, Pos: d.pos(resolve(n)), Field: field}}
}

// value is the text's value for the evaluation act.
func (t Text) value(ctx context.Context, r *Rule, act *expr.Activation) (string, error) {
	if t.Template == nil {
		return t.Literal, nil
	}
	v, err := t.Template.Render(ctx, act)
	if err != nil {
		return "", r.templateError(t.Template, "", err)
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
func (l *Lookup) query(ctx context.Context, r *Rule, act *expr.Activation, trigger *unstructured.Unstructured, namespaced bool) (LookupQuery, error) {
	fail := func(field string, err error) error {
		return &RenderError{Pos: l.Pos, Rule: r.Name, Field: join(l.Field, field), Err: err}
	}
	q := LookupQuery{Lookup: l, Selector: labels.Everything()}
	var err error
	if q.Namespace, err = l.Namespace.value(ctx, r, act); err != nil {
		return q, err
	}
	if q.Name, err = l.Name.value(ctx, r, act); err != nil {
		return q, err
	}
	if !l.List() && q.Name == "" {
		return q, fail("name", fmt.Errorf("rendered an empty name"))
	}
	sel, err := l.LabelSelector.value(ctx, r, act)
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
	return q, nil
}

// lookups resolves and reads the rule's lookups for act: lookups.<id> is
// the object (nil when absent) or the list, sorted by namespace and name.
func (r *Rule) lookups(ctx context.Context, act *expr.Activation, trigger *unstructured.Unstructured, scoper Scoper, lk Lookuper) (map[string]any, error) {
	out := make(map[string]any, len(r.Lookups))
	for _, l := range r.Lookups {
		namespaced, err := scoper.Namespaced(l.GVK)
		if err != nil {
			return nil, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: err}
		}
		q, err := l.query(ctx, r, act, trigger, namespaced)
		if err != nil {
			return nil, err
		}
		if lk == nil {
			return nil, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: fmt.Errorf("no objects to look up %s in", l.Kind)}
		}
		objs, err := lk.Lookup(ctx, q)
		if err != nil {
			return nil, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: err}
		}
		if !l.List() {
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
		}
		out[l.ID] = list
	}
	return out, nil
}
