package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

const (
	minResyncPeriod       = time.Second
	maxWorkers            = 512
	reservedManagedByNote = "syncloop sets it on every child"
)

var (
	celIdentifier = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	celReserved   = map[string]bool{
		"in": true, "as": true, "break": true, "const": true, "continue": true, "else": true,
		"for": true, "function": true, "if": true, "import": true, "let": true, "loop": true,
		"package": true, "namespace": true, "return": true, "var": true, "void": true,
		"while": true, "true": true, "false": true, "null": true,
	}
)

// isRuleDocument tells rule documents from others (sample objects, CRDs)
// that may share a directory: a document is a rule when its kind is Rule or
// its apiVersion is in the syncloop.dev group. Anything else is skipped.
func isRuleDocument(root *yaml.Node) bool {
	root = resolve(root)
	if root.Kind != yaml.MappingNode {
		return true // not an object at all: decoding reports it
	}
	var apiVersion, kind string
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch resolve(root.Content[i]).Value {
		case "apiVersion":
			apiVersion = resolve(root.Content[i+1]).Value
		case "kind":
			kind = resolve(root.Content[i+1]).Value
		}
	}
	if apiVersion == "" && kind == "" {
		return true
	}
	if kind == TestKind {
		return false // syncloop test's
	}
	return kind == Kind || strings.HasPrefix(apiVersion, Group+"/") || apiVersion == Group
}

// peekName returns the document's metadata.name when it is a valid rule
// name, so that every error of the document can name its rule.
func peekName(root *yaml.Node) string {
	root = resolve(root)
	if root.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if resolve(root.Content[i]).Value != "metadata" {
			continue
		}
		md := resolve(root.Content[i+1])
		if md.Kind != yaml.MappingNode {
			return ""
		}
		for j := 0; j+1 < len(md.Content); j += 2 {
			if resolve(md.Content[j]).Value == "name" {
				if v := resolve(md.Content[j+1]); v.Kind == yaml.ScalarNode && len(validation.IsDNS1123Label(v.Value)) == 0 {
					return v.Value
				}
			}
		}
	}
	return ""
}

// decodeRule decodes, validates and compiles one rule document. It returns
// nil when the document has errors (all of them are in d.errs).
func (d *decoder) decodeRule(root *yaml.Node, c *expr.Compiler) *Rule {
	errsBefore := len(d.errs)
	d.rule = peekName(root)
	pos := positions{}
	docVal, _ := d.value(root, nil, "", pos)
	top := d.fields(root, "", RuleFormat.known("")...)
	if top == nil {
		return nil
	}
	r := &Rule{Pos: d.pos(resolve(root)), Installation: d.installation}

	if n, ok := top["apiVersion"]; !ok {
		d.errorf(root, "apiVersion", "required: %s", APIVersion)
	} else if v, ok := d.str(n, "apiVersion"); ok && v != APIVersion {
		d.errorf(n, "apiVersion", "must be %s, not %q", APIVersion, v)
	}
	if n, ok := top["kind"]; !ok {
		d.errorf(root, "kind", "required: %s", Kind)
	} else if v, ok := d.str(n, "kind"); ok && v != Kind {
		d.errorf(n, "kind", "must be %s, not %q", Kind, v)
	}

	if n, ok := top["metadata"]; !ok {
		d.errorf(root, "metadata.name", "required")
	} else if md := d.fields(n, "metadata", RuleFormat.known("metadata")...); md != nil {
		if nn, ok := md["name"]; !ok {
			d.errorf(n, "metadata.name", "required")
		} else if name, ok := d.str(nn, "metadata.name"); ok {
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				d.errorf(nn, "metadata.name", "%q is not a valid rule name: %s", name, strings.Join(errs, "; "))
			} else {
				r.Name = name
				d.tenantName(r, d.pos(nn))
			}
		}
	}

	spec, ok := top["spec"]
	if !ok {
		d.errorf(root, "spec", "required")
		return nil
	}
	d.decodeSpec(r, spec, docVal, pos, c)
	if r.API != nil && r.API.Status != nil {
		// The kind is whole (its own checks may still have failed): a
		// breaking change is said too.
		d.checkServedCRD(r)
	}
	if len(d.errs) > errsBefore {
		return nil
	}
	sum, err := json.Marshal(docVal)
	if err != nil {
		d.errorf(root, "", "internal: hashing the rule: %v", err)
		return nil
	}
	h := sha256.New()
	h.Write(revisionContent(docVal, sum))
	// The schemas that typed the rule are part of it: when one changes (a
	// CRD is updated), the rule is compiled and started again.
	if v, ok := d.schemas.(kinds.Versioner); ok {
		for _, gvk := range r.kinds() {
			if ver := v.Version(gvk); ver != "" {
				fmt.Fprintf(h, "\x00%s=%s", gvk, ver)
			}
		}
	}
	r.Hash = hex.EncodeToString(h.Sum(nil))
	r.Source = sum
	return r
}

// revisionContent is what a rule's revision is named by: its document
// (JSON) without spec.rollout, which says how a change rolls out, not what
// the rule does.
func revisionContent(doc any, sum []byte) []byte {
	m, _ := doc.(map[string]any)
	spec, _ := m["spec"].(map[string]any)
	if _, ok := spec["rollout"]; !ok {
		return sum
	}
	rest := make(map[string]any, len(spec))
	for k, v := range spec {
		if k != "rollout" {
			rest[k] = v
		}
	}
	top := make(map[string]any, len(m))
	for k, v := range m {
		top[k] = v
	}
	top["spec"] = rest
	out, err := json.Marshal(top)
	if err != nil {
		return sum
	}
	return out
}

// kinds are the kinds the rule reads and writes: its trigger's, its
// lookups' and its resources'.
func (r *Rule) kinds() []schema.GroupVersionKind {
	gvks := []schema.GroupVersionKind{r.Watch.GVK}
	for _, l := range r.Lookups {
		gvks = append(gvks, l.GVK)
	}
	for _, res := range r.Resources {
		for _, k := range res.Kinds {
			gvks = append(gvks, k.GVK)
		}
	}
	return gvks
}

// Groups are the API groups of the kinds the rule reads and writes.
func (r *Rule) Groups() []string {
	var groups []string
	for _, gvk := range r.kinds() {
		if !slices.Contains(groups, gvk.Group) {
			groups = append(groups, gvk.Group)
		}
	}
	return groups
}

func (d *decoder) decodeSpec(r *Rule, spec *yaml.Node, docVal any, pos positions, c *expr.Compiler) {
	f := d.fields(spec, "spec", RuleFormat.known("spec")...)
	if f == nil {
		return
	}
	if n, ok := f["api"]; ok {
		r.API = d.decodeAPI(n)
		if r.API == nil {
			return // the rule's kind is not known: its expressions would say so again
		}
		d.decodeConversions(r.API, n, docVal, pos, c)
		r.Watch.KindRef = r.API.KindRef
		r.Watch.LabelSelector, r.Watch.FieldSelector = labels.Everything(), fields.Everything()
	}
	if n, ok := f["watch"]; ok {
		d.decodeWatch(&r.Watch, n, r.API)
	} else if r.API == nil {
		d.errorf(spec, "spec.watch", "required (or spec.api, a kind the rule defines and watches)")
	}

	// Lookups are read after `when`, before the variables: the variables,
	// resources and status see them.
	// What expressions read is typed by the schemas of its kinds.
	ruleTypes := d.types(c, r, docVal)
	var lookupIDs []string
	if n, ok := f["lookups"]; ok {
		lookupIDs = d.decodeLookups(r, n, docVal, c, ruleTypes)
	}
	var varNames []string
	if n, ok := f["variables"]; ok {
		varNames = d.decodeVariables(r, n, c, expr.Scope{Lookups: lookupIDs, Types: ruleTypes})
	}
	if n, ok := f["when"]; ok {
		// `when` is evaluated before the variables — it decides whether they
		// are evaluated at all, and event handlers evaluate it alone.
		r.Watch.When = d.expression(n, "spec.when", c, expr.Scope{Types: ruleTypes}, expr.BoolResult)
	}

	var ids []string
	errsBefore := len(d.errs)
	scope := expr.Scope{Variables: varNames, Lookups: lookupIDs, Types: ruleTypes}
	if f["resources"] != nil || f["function"] != nil {
		ids = d.decodeResources(r, f["resources"], f["function"], docVal, pos, c, scope, errsBefore)
	}
	if n, ok := f["status"]; ok {
		scope.Children = nonNil(ids)
		d.decodeStatus(r, n, docVal, pos, c, scope)
	}
	if r.API != nil && len(d.errs) == errsBefore {
		d.finishAPI(r, docVal, c)
	}
	if f["resources"] == nil && f["function"] == nil && f["status"] == nil && r.Status == nil {
		d.errorf(spec, "spec", "a rule needs resources, a function, status, or some of them")
	}
	if len(d.errs) == errsBefore {
		d.checkScopes(r, docVal)
		d.checkReadsOwnWrites(r, docVal)
		r.resolveLookupReads()
	}
	d.decodeRuleOptions(r, f, c)
	d.decodeTeardown(r, spec, f)
	d.decodeRemoval(r, f)
	d.decodeIdentity(r, f)
	d.checkTenant(r, docVal)
}

// decodeVariables decodes spec.variables, each seeing scope and the
// variables declared before it, and returns their names.
func (d *decoder) decodeVariables(r *Rule, n *yaml.Node, c *expr.Compiler, scope expr.Scope) []string {
	var varNames []string
	for i, vn := range d.seq(n, "spec.variables") {
		field := fmt.Sprintf("spec.variables[%d]", i)
		vf := d.fields(vn, field, RuleFormat.known("spec.variables")...)
		if vf == nil {
			continue
		}
		name, nameOK := "", false
		if nn, ok := vf["name"]; !ok {
			d.errorf(vn, field+".name", "required")
		} else if name, nameOK = d.str(nn, field+".name"); nameOK {
			switch {
			case !celIdentifier.MatchString(name) || celReserved[name]:
				d.errorf(nn, field+".name", "%q is not a CEL identifier (letters, digits, _; not a reserved word)", name)
				nameOK = false
			case contains(varNames, name):
				d.errorf(nn, field+".name", "variable %q declared twice", name)
				nameOK = false
			}
		}
		en, ok := vf["expression"]
		if !ok {
			d.errorf(vn, field+".expression", "required")
			continue
		}
		// A variable sees the variables declared before it.
		scope.Variables = varNames
		e := d.expression(en, field+".expression", c, scope, expr.AnyResult)
		if nameOK {
			varNames = append(varNames, name)
			v := Variable{Name: name, Expr: e}
			if e != nil {
				v.Lookups = r.lookupsRead(e.LookupRefs(), e.VariableRefs())
			}
			r.Variables = append(r.Variables, v)
		}
	}
	return varNames
}

// decodeStatus decodes spec.status, checked against the trigger's status
// schema when there is one.
func (d *decoder) decodeStatus(r *Rule, n *yaml.Node, docVal any, pos positions, c *expr.Compiler, scope expr.Scope) {
	if resolve(n).Kind != yaml.MappingNode {
		d.errorf(n, "spec.status", "must be a mapping, not %s", kindName(resolve(n)))
		return
	}
	prefix := expr.Path{"spec", "status"}
	scope.Status = true
	t := d.template(n, prefix, docVal, pos, c, scope)
	if t == nil {
		return
	}
	r.Status = &StatusTemplate{Template: t}
	if d.schemas != nil {
		if s := d.schemas.Schema(r.Watch.GVK); s != nil {
			if st, ok := s.Properties["status"]; ok {
				d.checkSchema(&st, prefix, docVal, t, r.Watch.Kind+" status", false)
			}
		}
	}
}

// resolveLookupReads notes which lookups each resource and the status
// read, themselves or through variables.
func (r *Rule) resolveLookupReads() {
	for _, res := range r.Resources {
		var lookups, variables []string
		for _, e := range []*Expression{res.When, res.ForEach} {
			if e != nil {
				lookups, variables = append(lookups, e.LookupRefs()...), append(variables, e.VariableRefs()...)
			}
		}
		if res.Template != nil {
			lookups, variables = append(lookups, res.Template.LookupRefs()...), append(variables, res.Template.VariableRefs()...)
		} else { // a function is given every lookup and variable
			for _, l := range r.Lookups {
				if !l.Related { // given only as its customize function says
					lookups = append(lookups, l.ID)
				}
			}
			for _, v := range r.Variables {
				variables = append(variables, v.Name)
			}
		}
		res.Lookups = r.lookupsRead(lookups, variables)
	}
	if r.Status != nil {
		r.Status.Lookups = r.lookupsRead(r.Status.LookupRefs(), r.Status.VariableRefs())
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// decodeWatch decodes spec.watch. With api (the rule defines a kind), the
// kind is api's: apiVersion and kind may be left out, and must be api's
// when given.
func (d *decoder) decodeWatch(w *Watch, n *yaml.Node, api *API) {
	f := d.fields(n, "spec.watch", RuleFormat.known("spec.watch")...)
	if f == nil {
		return
	}
	if api == nil {
		w.APIVersion, w.Kind = d.apiVersionKind(n, f, "spec.watch")
	} else {
		for _, kv := range [][2]string{{"apiVersion", api.APIVersion}, {"kind", api.Kind}} {
			key, want := kv[0], kv[1]
			if kn, ok := f[key]; ok {
				if v, ok := d.str(kn, "spec.watch."+key); ok && v != want {
					d.errorf(kn, "spec.watch."+key, "%q: the rule watches the kind it defines, %s (spec.api); leave it out", v, want)
				}
			}
		}
	}
	if nn, ok := f["namespace"]; ok {
		if v, ok := d.str(nn, "spec.watch.namespace"); ok {
			if errs := validation.IsDNS1123Label(v); v != "" && len(errs) > 0 {
				d.errorf(nn, "spec.watch.namespace", "%q is not a valid namespace: %s", v, strings.Join(errs, "; "))
			}
			w.Namespace = v
		}
	}
	w.LabelSelector = labels.Everything()
	if nn, ok := f["labelSelector"]; ok {
		if v, ok := d.str(nn, "spec.watch.labelSelector"); ok {
			sel, err := labels.Parse(v)
			if err != nil {
				d.errorf(nn, "spec.watch.labelSelector", "%v", err)
			} else {
				w.LabelSelector = sel
			}
		}
	}
	w.FieldSelector = fields.Everything()
	if nn, ok := f["fieldSelector"]; ok {
		if v, ok := d.str(nn, "spec.watch.fieldSelector"); ok {
			sel, err := fields.ParseSelector(v)
			if err != nil {
				d.errorf(nn, "spec.watch.fieldSelector", "%v", err)
			} else {
				w.FieldSelector = sel
			}
		}
	}
	if gv, err := schema.ParseGroupVersion(w.APIVersion); err == nil {
		w.GVK = gv.WithKind(w.Kind)
	}
}
