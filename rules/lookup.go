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

// decodeLookups decodes spec.lookups and returns the lookup ids as
// written (valid or not: a lookup with an error is still declared, so that
// what reads it is not reported as reading an undeclared one). A lookup's
// namespace, name and labelSelector may read other lookups: they are read
// in dependency order (Rule.LookupOrder), and a cycle is an error.
func (d *decoder) decodeLookups(r *Rule, n *yaml.Node, docVal any, c *expr.Compiler, ts *expr.Types) []string {
	declared := declaredIDs(docVal, "lookups")
	scope := expr.Scope{Lookups: nonNil(declared), InLookup: true, Types: ts}
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
		text := func(key string) Text {
			nn := f[key]
			t := d.text(nn, field+"."+key, c, scope)
			if t.Template != nil {
				for _, id := range t.Template.LookupRefs() {
					l.Refs = append(l.Refs, Ref{ID: id, Pos: refPos(d, resolve(nn), "lookups", id, t.Template.Pos)})
				}
			}
			return t
		}
		if nn, ok := f["namespace"]; ok {
			l.Namespace = text("namespace")
			if v := l.Namespace.Literal; l.Namespace.IsLiteral() && v != "" {
				if errs := validation.IsDNS1123Label(v); len(errs) > 0 {
					d.errorf(nn, field+".namespace", "%q is not a valid namespace: %s", v, strings.Join(errs, "; "))
				}
			}
		}
		if nn, ok := f["name"]; ok {
			errs := len(d.errs)
			l.Name = text("name")
			if l.Name.Empty() && len(d.errs) == errs {
				d.errorf(nn, field+".name", "must not be empty: leave name out for a list")
			}
		}
		if nn, ok := f["labelSelector"]; ok {
			if _, named := f["name"]; named {
				d.errorf(nn, field+".labelSelector", "a lookup by name reads one object: leave name out for a list by labels")
			}
			l.LabelSelector = text("labelSelector")
			if l.LabelSelector.IsLiteral() {
				if _, err := labels.Parse(l.LabelSelector.Literal); err != nil {
					d.errorf(nn, field+".labelSelector", "%v", err)
				}
			}
		}
		if nn, ok := f["required"]; ok {
			l.Required, _ = d.boolean(nn, field+".required")
		}
		if l.ID != "" {
			ids = append(ids, l.ID)
		}
		if len(d.errs) == errsBefore && l.ID != "" {
			l.Index = len(r.Lookups)
			r.Lookups = append(r.Lookups, l)
		}
	}
	if len(r.Lookups) == len(ids) {
		d.lookupGraph(r)
	}
	return declared
}

// lookupGraph links the rule's lookups by the lookups.<id> their
// namespace, name and selector read, orders them, and reports every cycle.
func (d *decoder) lookupGraph(r *Rule) {
	byID := make(map[string]*Lookup, len(r.Lookups))
	for _, l := range r.Lookups {
		byID[l.ID] = l
	}
	for _, l := range r.Lookups {
		for _, ref := range l.Refs {
			if dep := byID[ref.ID]; dep != nil && !slices.Contains(l.Deps, dep) {
				l.Deps = append(l.Deps, dep)
			}
		}
		slices.SortFunc(l.Deps, func(a, b *Lookup) int { return a.Index - b.Index })
	}
	found := cycles(r.Lookups)
	pos := func(l *Lookup) Pos { return l.Pos }
	for _, cycle := range found {
		d.errorAt(refTo(cycle[0], cycle[1%len(cycle)].ID, cycle[0].Pos), cycle[0].Field, "%s", describeCycle(cycle, "lookup", "lookups", pos))
	}
	if len(found) == 0 {
		r.LookupOrder = topoOrder(r.Lookups)
	}
}

// text decodes a string field that may hold ${} over the trigger (and,
// in a lookup, the lookups before it). The value of a sole ${expr} must be
// a string.
func (d *decoder) text(n *yaml.Node, field string, c *expr.Compiler, scope expr.Scope) Text {
	v, ok := d.str(n, field)
	if !ok || !strings.Contains(v, "${") {
		return Text{Literal: v}
	}
	t, err := c.CompileString(v, scope)
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
// It also returns what they read.
func (r *Rule) lookups(ctx context.Context, act *expr.Activation, trigger *unstructured.Unstructured, scoper Scoper, lk Lookuper) (map[string]any, lookupReads, error) {
	out := make(map[string]any, len(r.Lookups))
	act.Lookups = out // a lookup reads the ones before it in LookupOrder
	reads := lookupReads{objects: map[readKey]lookupRead{}, queries: map[string]LookupQuery{}}
	for _, l := range r.LookupOrder {
		namespaced, err := scoper.Namespaced(l.GVK)
		if err != nil {
			return nil, lookupReads{}, &RenderError{Pos: l.Pos, Rule: r.Name, Field: l.Field, Err: err}
		}
		q, err := l.query(ctx, r, act, trigger, namespaced)
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
	lookup *Lookup
	// listed is the object a list gave; nil for a lookup by name.
	listed *unstructured.Unstructured
}

// conflict reports a child that is what one of trigger t's lookups reads: a
// rule never writes what it reads — whatever adopt says — or a copy of an
// object into its own namespace would overwrite, then delete, its source.
// An object a list gave that is already this trigger's child is not a
// conflict: a list may select the children it leads to.
func (reads lookupReads) conflict(r *Rule, c Child, t Trigger) error {
	gvk := c.Object.GroupVersionKind()
	read, ok := reads.objects[readKey{gvk.Group, gvk.Kind, c.Object.GetNamespace(), c.Object.GetName()}]
	if !ok || (read.listed != nil && r.OwnershipOf(read.listed, t) == Owned) {
		return nil
	}
	return &ConflictError{Rule: r.Name, Resource: c.ResourceID, Object: RefOf(c.Object),
		Why: fmt.Sprintf("is the object lookup %q reads", read.lookup.ID)}
}

// lookupsRead are the lookup ids an expression reads: those it names, and
// those of the variables it names (sorted, without duplicates).
func (r *Rule) lookupsRead(lookups, variables []string) []string {
	out := slices.Clone(lookups)
	for _, name := range variables {
		for _, v := range r.Variables {
			if v.Name == name {
				out = append(out, v.Lookups...)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// absentRequired are the required lookups whose object is absent (a list:
// empty), in the order they are read, with what they asked.
func (r *Rule) absentRequired(values map[string]any, reads lookupReads) []LookupQuery {
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
