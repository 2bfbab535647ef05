package rules

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules/expr"
)

// Decoding spec.resources: each resource, its template, its readiness.

// decodeResources decodes spec.resources and, if no error was found
// since errsBefore, their graph; it returns the resources' ids. A
// resource may read any other as children.<id>: every id is declared to
// every resource, and the references become the graph.
func (d *decoder) decodeResources(r *Rule, n, fn *yaml.Node, docVal any, pos positions, c *expr.Compiler, scope expr.Scope, errsBefore int) []string {
	var ids []string
	declared := declaredIDs(docVal, "resources")
	if fn != nil {
		declared = append(declared, SyncResourceID)
	}
	scope.Children = nonNil(declared)
	var nodes []*yaml.Node
	if n != nil {
		nodes = d.seq(n, "spec.resources")
	}
	for i, rn := range nodes {
		if res := d.decodeResource(i, rn, docVal, pos, c, scope, ids); res != nil {
			r.Resources = append(r.Resources, res)
			ids = append(ids, res.ID)
		}
	}
	if fn != nil {
		if res := d.decodeRuleFunction(fn, len(nodes), ids, docVal); res != nil {
			r.Resources = append(r.Resources, res)
			r.addRelatedLookups(res)
			ids = append(ids, res.ID)
		}
	}
	if len(d.errs) == errsBefore {
		d.graph(r)
	}
	return ids
}

func (d *decoder) decodeResource(i int, n *yaml.Node, docVal any, pos positions, c *expr.Compiler, scope expr.Scope, ids []string) *Resource {
	field := fmt.Sprintf("spec.resources[%d]", i)
	f := d.fields(n, field, RuleFormat.known("spec.resources")...)
	if f == nil {
		return nil
	}
	errsBefore := len(d.errs)
	res := &Resource{Index: i, ID: d.id(n, f, field, "resource", ids), Mode: ModeOwn, Pos: d.pos(resolve(n))}
	decodeOneOf(d, f, field, "mode", &res.Mode, ModeOwn, ModePatch)
	decodeOneOf(d, f, field, "deletionPolicy", &res.DeletionPolicy, DeletionDelete, DeletionOrphan)
	if nn, ok := f["adopt"]; ok {
		if v, ok := d.boolean(nn, field+".adopt"); ok {
			res.Adopt, res.adoptSet = v, true
			if res.Mode == ModePatch {
				d.errorf(nn, field+".adopt", "a mode: patch resource writes onto objects it does not own without adopting them: leave adopt out")
			}
		}
	}
	if nn, ok := f["createOnce"]; ok {
		if v, ok := d.boolean(nn, field+".createOnce"); ok {
			res.CreateOnce, res.createOnceSet = v, true
			if res.Mode == ModePatch && v {
				d.errorf(nn, field+".createOnce", "a mode: patch resource creates nothing: leave createOnce out")
			}
		}
	}
	if nn, ok := f["when"]; ok {
		res.When = d.expression(nn, field+".when", c, scope, expr.BoolResult)
		res.Refs = append(res.Refs, d.exprRefs(nn, res.When)...)
	}
	if nn, ok := f["clusters"]; ok {
		d.decodeClusters(res, nn, field, c, scope)
		scope.Cluster = true // even when clusters is wrong: one error, not one per use
	}
	if nn, ok := f["forEach"]; ok {
		res.ForEach = d.expression(nn, field+".forEach", c, scope, expr.ListResult)
		res.Refs = append(res.Refs, d.exprRefs(nn, res.ForEach)...)
		scope.ForEach = true
		if res.ForEach != nil {
			scope.Item = res.ForEach.Elem()
		}
	}
	tn, ok := f["template"]
	d.checkClusters(res, n, field)
	if fnode, fok := f["function"]; fok {
		if ok {
			d.errorf(fnode, field+".function", "a resource has a template or a function, not both")
			return nil
		}
		return d.decodeFunctionResource(res, n, fnode, f, field, c, docVal, errsBefore)
	}
	if !ok {
		d.errorf(n, field+".template", "required (or a function)")
		return nil
	}
	if t := resolve(tn); t.Kind == yaml.ScalarNode && strings.Contains(t.Value, "${") {
		d.errorf(tn, field+".template", "must be a mapping of the child's fields, not one ${} expression: compute the fields inside it (a computed apiVersion or kind lists its choices in kinds)")
		return nil
	}
	tf := d.fields(tn, field+".template", templateTopFields(tn)...)
	if tf == nil {
		return nil
	}
	d.decodeKind(res, n, tn, f, tf, field)
	if nn, ok := f["readyWhen"]; ok {
		d.decodeReadyWhen(res, nn, field, c)
	}
	d.decodeTemplate(res, tn, tf, field, docVal, pos, c, scope, errsBefore)
	if len(d.errs) > errsBefore {
		return nil
	}
	return res
}

// decodeFunctionResource decodes the rest of a resource whose children a
// function computes (fn): the kinds it may return, listed; its readiness;
// the function and its module.
func (d *decoder) decodeFunctionResource(res *Resource, n, fn *yaml.Node, f map[string]*yaml.Node, field string, c *expr.Compiler, docVal any, errsBefore int) *Resource {
	switch {
	case res.ForEach != nil:
		d.errorf(f["forEach"], field+".forEach", "a function returns a list of children itself: leave forEach out")
	case res.Mode == ModePatch:
		d.errorf(f["mode"], field+".mode", "a function's children are syncloop's own: mode patch takes a template")
	}
	if kn, ok := f["kinds"]; ok {
		d.decodeKindList(res, kn, field)
	} else {
		d.errorf(n, field+".kinds", "required: list every kind the function may return ({apiVersion, kind} each); it fails the trigger on any other")
	}
	if nn, ok := f["readyWhen"]; ok {
		d.decodeReadyWhen(res, nn, field, c)
	}
	d.decodeFunction(res, fn, field+".function", []any{"spec", "resources", res.Index, "function"}, docVal)
	if len(d.errs) > errsBefore {
		return nil
	}
	return res
}

// apiVersionKind decodes the required, literal apiVersion and kind of a
// watch or a template.
func (d *decoder) apiVersionKind(parent *yaml.Node, f map[string]*yaml.Node, field string) (string, string) {
	var apiVersion, kind string
	if n, ok := f["apiVersion"]; !ok {
		d.errorf(parent, JoinField(field, "apiVersion"), "required")
	} else if v, ok := d.str(n, JoinField(field, "apiVersion")); ok {
		if strings.Contains(v, "${") {
			d.errorf(n, JoinField(field, "apiVersion"), "must be literal (no ${}): the kinds a rule touches are known when it loads")
		} else if _, err := schema.ParseGroupVersion(v); err != nil || v == "" {
			d.errorf(n, JoinField(field, "apiVersion"), "%q is not a group/version", v)
		} else {
			apiVersion = v
		}
	}
	if n, ok := f["kind"]; !ok {
		d.errorf(parent, JoinField(field, "kind"), "required")
	} else if v, ok := d.str(n, JoinField(field, "kind")); ok {
		if strings.Contains(v, "${") {
			d.errorf(n, JoinField(field, "kind"), "must be literal (no ${}): the kinds a rule touches are known when it loads")
		} else if v == "" {
			d.errorf(n, JoinField(field, "kind"), "must not be empty")
		} else {
			kind = v
		}
	}
	return apiVersion, kind
}

// decodeReadyWhen decodes a resource's readyWhen: it judges the live
// child, so self is of the template's kind.
func (d *decoder) decodeReadyWhen(res *Resource, n *yaml.Node, field string, c *expr.Compiler) {
	self := expr.Scope{Self: true}
	if res.Kind != "" {
		self.SelfType = d.kindType(c, res.GVK)
	}
	for j, en := range d.seq(n, field+".readyWhen") {
		e := d.expression(en, fmt.Sprintf("%s.readyWhen[%d]", field, j), c, self, expr.BoolResult)
		if e != nil {
			res.ReadyWhen = append(res.ReadyWhen, e)
		}
	}
}

// decodeTemplate decodes a resource's template (tn, its top fields tf),
// checked against its kind's schema if nothing failed since errsBefore:
// the references to other resources it holds, and its literal name and
// namespace.
func (d *decoder) decodeTemplate(res *Resource, tn *yaml.Node, tf map[string]*yaml.Node, field string, docVal any, pos positions, c *expr.Compiler, scope expr.Scope, errsBefore int) {
	i := res.Index
	d.checkMetadata(tn, tf, field+".template")
	res.Template = d.template(tn, expr.Path{"spec", "resources", i, "template"}, docVal, pos, c, scope)
	for _, k := range res.Kinds {
		if d.schemas != nil && res.Template != nil && len(d.errs) == errsBefore {
			d.checkSchema(d.schemas.Schema(k.GVK), expr.Path{"spec", "resources", i, "template"}, docVal, res.Template, k.Kind, res.Mode == ModeOwn)
		}
	}
	if res.Template != nil {
		for _, ref := range res.Template.ChildRefs() {
			full := append(expr.Path{"spec", "resources", i, "template"}, ref.Path...)
			p := res.Template.PosOf(ref.Path)
			if sp, ok := pos[posKey(full, false)]; ok {
				p = refPos(d, sp.node, "children", ref.ID, p)
			}
			res.Refs = append(res.Refs, Ref{ID: ref.ID, Pos: p})
		}
	}
	for _, f := range []struct {
		key string
		to  *string
	}{{"name", &res.LiteralName}, {"namespace", &res.LiteralNamespace}} {
		if v, ok := lookup(docVal, expr.Path{"spec", "resources", i, "template", "metadata", f.key}).(string); ok && !strings.Contains(v, "${") {
			*f.to = v
		}
	}
	res.NoNamespace = lookup(docVal, expr.Path{"spec", "resources", i, "template", "metadata", "namespace"}) == nil
}

// templateTopFields accepts every top-level key of a template (any kind's
// body is allowed); fields() is used only to get the mapping checks.
func templateTopFields(n *yaml.Node) []string {
	n = resolve(n)
	var keys []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		keys = append(keys, resolve(n.Content[i]).Value)
	}
	return keys
}

// checkMetadata validates what must hold of every child's metadata before
// rendering: a name (literal or templated), no generateName, no labels or
// annotations that syncloop owns.
func (d *decoder) checkMetadata(tn *yaml.Node, tf map[string]*yaml.Node, field string) {
	mn, ok := tf["metadata"]
	if !ok {
		d.errorf(tn, field+".metadata.name", "required")
		return
	}
	mf := d.fields(mn, field+".metadata", templateTopFields(mn)...)
	if mf == nil {
		return
	}
	if n, ok := mf["generateName"]; ok {
		d.errorf(n, field+".metadata.generateName", "not supported: syncloop finds its children again by name; set metadata.name")
	}
	if n, ok := mf["name"]; !ok {
		d.errorf(mn, field+".metadata.name", "required")
	} else if v, ok := d.str(n, field+".metadata.name"); ok && v == "" {
		d.errorf(n, field+".metadata.name", "must not be empty")
	}
	if n, ok := mf["namespace"]; ok {
		if v, ok := d.str(n, field+".metadata.namespace"); ok && !strings.Contains(v, "${") {
			if errs := validation.IsDNS1123Label(v); len(errs) > 0 {
				d.errorf(n, field+".metadata.namespace", "%q is not a valid namespace: %s", v, strings.Join(errs, "; "))
			}
		}
	}
	for _, section := range []string{"labels", "annotations"} {
		sn, ok := mf[section]
		if !ok || resolve(sn).Kind != yaml.MappingNode {
			continue
		}
		sn = resolve(sn)
		for i := 0; i+1 < len(sn.Content); i += 2 {
			k := resolve(sn.Content[i])
			if IsReservedKey(k.Value) {
				d.errorf(k, field+".metadata."+section, "%q is reserved: %s", k.Value, reservedManagedByNote)
			}
		}
	}
	if n, ok := mf["ownerReferences"]; ok {
		d.errorf(n, field+".metadata.ownerReferences", "not supported: syncloop sets the controller reference to the trigger")
	}
}

// noteCreateOnce notes, once per rule, that createOnce resources have the
// rule write its triggers: its identity needs patch on their kind.
func (d *decoder) noteCreateOnce(r *Rule) {
	for _, res := range r.Resources {
		if res.CreateOnce {
			d.notes = append(d.notes, &Error{Pos: res.Pos, Rule: d.rule, Field: fmt.Sprintf("spec.resources[%d].createOnce", res.Index),
				Msg: fmt.Sprintf("note: resource %q is made once: the rule remembers its children in each trigger's annotation %s, so it needs patch on %s %s",
					res.ID, CreatedOnceKey(r.Name), r.Watch.APIVersion, r.Watch.Kind)})
			return
		}
	}
}
