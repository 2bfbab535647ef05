package rules

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules/expr"
)

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
	linkDeps(r.Lookups, func(l *Lookup, deps []*Lookup) { l.Deps = deps })
	field := func(l *Lookup) string { return l.Field }
	if !reportCycles(d, r.Lookups, field, "lookup", "lookups", func(l *Lookup) Pos { return l.Pos }) {
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
