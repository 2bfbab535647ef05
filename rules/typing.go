package rules

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// What the rule's expressions and templates are typed by: the schemas of
// the kinds they read and write.

// types are what the rule's expressions read, as far as the schemas of
// their kinds tell: the trigger's, the lookups' and the children's kinds,
// read from the document before anything is compiled (the rule's
// expressions share one environment). nil when schemas are not checked.
func (d *decoder) types(c *expr.Compiler, r *Rule, docVal any) *expr.Types {
	if d.schemas == nil {
		return nil
	}
	ts := &expr.Types{Lookups: map[string]*expr.Type{}, Children: map[string]*expr.Type{}}
	if r.Watch.Kind != "" {
		ts.Object = d.kindType(c, r.Watch.GVK)
		d.noteUntyped(r, ts.Object, r.Watch.GVK, "spec.watch")
	}
	// typeAt is the type of the kind named by apiVersion and kind at path
	// in m, a list of it when many; false if they are not literal.
	typeAt := func(m map[string]any, path []any, field string, many bool) (string, *expr.Type, bool) {
		id, _ := m["id"].(string)
		apiVersion, _ := lookup(m, append(path, "apiVersion")).(string)
		kind, _ := lookup(m, append(path, "kind")).(string)
		if id != "" && strings.Contains(apiVersion+kind, "${") {
			return id, nil, true // a computed kind: read as dyn
		}
		gv, err := schema.ParseGroupVersion(apiVersion)
		if id == "" || kind == "" || err != nil {
			return "", nil, false
		}
		t := d.kindType(c, gv.WithKind(kind))
		d.noteUntyped(r, t, gv.WithKind(kind), field)
		if many && t != nil {
			t = expr.ListOf(t)
		}
		return id, t, true
	}
	lookups, _ := lookup(docVal, []any{"spec", "lookups"}).([]any)
	for i, lv := range lookups {
		m, _ := lv.(map[string]any)
		_, named := m["name"]
		if id, t, ok := typeAt(m, nil, fmt.Sprintf("spec.lookups[%d]", i), !named); ok {
			ts.Lookups[id] = t
		}
	}
	resources, _ := lookup(docVal, []any{"spec", "resources"}).([]any)
	for i, rv := range resources {
		m, _ := rv.(map[string]any)
		_, forEach := m["forEach"]
		if _, clusters := m["clusters"]; clusters {
			forEach = true // a list: one child per cluster
		}
		if _, fn := m["function"]; fn {
			if id, _ := m["id"].(string); id != "" {
				ts.Children[id] = nil // a list of what the function returns: read as dyn
			}
			continue
		}
		if id, t, ok := typeAt(m, []any{"template"}, fmt.Sprintf("spec.resources[%d].template", i), forEach); ok {
			ts.Children[id] = t
		}
	}
	if _, ok := lookup(docVal, []any{"spec", "function"}).(map[string]any); ok {
		ts.Children[SyncResourceID] = nil // what the rule's function returns: dyn
	}
	return ts
}

// noteUntyped notes a kind with no schema, once per rule.
func (d *decoder) noteUntyped(r *Rule, t *expr.Type, gvk schema.GroupVersionKind, field string) {
	if t != nil {
		return
	}
	msg := fmt.Sprintf("note: %s %s has no schema (not built in, no CRD given): expressions read it as dyn and its templates are not checked",
		gvk.GroupVersion(), gvk.Kind)
	for _, n := range d.notes {
		if n.Msg == msg && n.Rule == d.rule {
			return
		}
	}
	d.notes = append(d.notes, &Error{Pos: r.Pos, Rule: d.rule, Field: field, Msg: msg})
}

// kindType is the CEL type of a kind's objects; nil (dyn) when its schema
// is not known.
func (d *decoder) kindType(c *expr.Compiler, gvk schema.GroupVersionKind) *expr.Type {
	if d.schemas == nil {
		return nil
	}
	s := d.schemas.Schema(gvk)
	if s == nil {
		return nil
	}
	return c.KindType(strings.TrimPrefix(gvk.GroupVersion().String()+"."+gvk.Kind, "."), s)
}

// checkSchema reports what in the template at prefix the schema s of its
// kind (what, for messages) would not take: unknown fields, values of the
// wrong type; with required, missing required fields, as warnings. s nil:
// the kind is not known, nothing is checked.
func (d *decoder) checkSchema(s *spec.Schema, prefix expr.Path, docVal any, t *Template, what string, required bool) {
	if s == nil {
		return
	}
	kindOf := func(path []any, _ string) kinds.Kind {
		o, whole := t.OutputAt(expr.Path(path))
		if !whole {
			return kinds.String // text around ${} parts
		}
		return [...]kinds.Kind{expr.TypeDyn: kinds.Unknown, expr.TypeString: kinds.String, expr.TypeInt: kinds.Int,
			expr.TypeDouble: kinds.Number, expr.TypeBool: kinds.Bool, expr.TypeList: kinds.List, expr.TypeMap: kinds.Map,
			expr.TypeNull: kinds.Null}[o]
	}
	for _, p := range kinds.Check(s, lookup(docVal, prefix), kindOf, required) {
		full := append(append(expr.Path(nil), prefix...), p.Path...)
		at, ok := d.at[posKey(full, p.Key || p.Warning)] // a mapping lacking a field: at its key
		if !ok {
			if at, ok = d.at[posKey(full, false)]; !ok {
				at = t.Pos
			}
		}
		msg := p.Msg
		if p.Key {
			msg = fmt.Sprintf("unknown field %q: %s has no such field", p.Field, what)
			if s := expr.Suggest(p.Field, p.Known); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
		}
		if p.Warning {
			d.warns = append(d.warns, &Error{Pos: at, Rule: d.rule, Field: PathField("", full), Msg: "warning: " + msg})
			continue
		}
		d.errorAt(at, PathField("", full), "%s", msg)
	}
}
