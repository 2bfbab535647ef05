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
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// Labels and annotations syncloop puts on every child (DESIGN §4). A
// template may not set them.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelRule      = Group + "/rule"
	LabelOwnerUID  = Group + "/owner-uid"
	// LabelInstallation names the installation of syncloop a child
	// belongs to; the default installation's children carry none.
	LabelInstallation     = Group + "/installation"
	AnnotationOwner       = Group + "/owner"
	AnnotationResourceID  = Group + "/resource-id"
	ManagedByValue        = "syncloop"
	FieldManagerPrefix    = "syncloop/"
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
		r.When = d.expression(n, "spec.when", c, expr.Scope{Types: ruleTypes}, expr.BoolResult)
	}

	var ids []string
	errsBefore := len(d.errs)
	scope := expr.Scope{Variables: varNames, Lookups: lookupIDs, Types: ruleTypes}
	if n, ok := f["resources"]; ok {
		ids = d.decodeResources(r, n, docVal, pos, c, scope, errsBefore)
	}
	if n, ok := f["status"]; ok {
		scope.Children = nonNil(ids)
		d.decodeStatus(r, n, docVal, pos, c, scope)
	}
	if r.API != nil && len(d.errs) == errsBefore {
		d.finishAPI(r, docVal, c)
	}
	if _, hasRes := f["resources"]; !hasRes && r.Status == nil {
		if _, hasStatus := f["status"]; !hasStatus {
			d.errorf(spec, "spec", "a rule needs resources, status, or both")
		}
	}
	if len(d.errs) == errsBefore {
		d.checkScopes(r, docVal)
		d.checkReadsOwnWrites(r, docVal)
		r.resolveLookupReads()
	}
	d.decodeRuleOptions(r, f)
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

// decodeResources decodes spec.resources and, if no error was found
// since errsBefore, their graph; it returns the resources' ids. A
// resource may read any other as children.<id>: every id is declared to
// every resource, and the references become the graph.
func (d *decoder) decodeResources(r *Rule, n *yaml.Node, docVal any, pos positions, c *expr.Compiler, scope expr.Scope, errsBefore int) []string {
	var ids []string
	scope.Children = nonNil(declaredIDs(docVal, "resources"))
	for i, rn := range d.seq(n, "spec.resources") {
		if res := d.decodeResource(i, rn, docVal, pos, c, scope, ids); res != nil {
			r.Resources = append(r.Resources, res)
			ids = append(ids, res.ID)
		}
	}
	if len(d.errs) == errsBefore {
		d.graph(r)
	}
	return ids
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
	r.Status = d.template(n, prefix, docVal, pos, c, scope)
	if d.schemas != nil && r.Status != nil {
		if s := d.schemas.Schema(r.Watch.GVK); s != nil {
			if st, ok := s.Properties["status"]; ok {
				d.checkSchema(&st, prefix, docVal, r.Status, r.Watch.Kind+" status", false)
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
		lookups, variables = append(lookups, res.Template.LookupRefs()...), append(variables, res.Template.VariableRefs()...)
		res.Lookups = r.lookupsRead(lookups, variables)
	}
	if r.Status != nil {
		r.StatusLookups = r.lookupsRead(r.Status.LookupRefs(), r.Status.VariableRefs())
	}
}

// decodeRuleOptions decodes how the rule runs, with their defaults:
// deletionPolicy and adopt (which its resources inherit), forceConflicts,
// workers, resyncPeriod, rateLimit and maxRetries.
func (d *decoder) decodeRuleOptions(r *Rule, f map[string]*yaml.Node) {
	r.DeletionPolicy = DeletionDelete
	if n, ok := f["deletionPolicy"]; ok {
		if v, ok := d.oneOf(n, "spec.deletionPolicy", string(DeletionDelete), string(DeletionOrphan)); ok {
			r.DeletionPolicy = DeletionPolicy(v)
		}
	}
	adopt, createOnce := false, false
	if n, ok := f["adopt"]; ok {
		adopt, _ = d.boolean(n, "spec.adopt")
	}
	if n, ok := f["createOnce"]; ok {
		createOnce, _ = d.boolean(n, "spec.createOnce")
	}
	for _, res := range r.Resources {
		if res.DeletionPolicy == "" {
			res.DeletionPolicy = r.DeletionPolicy
		}
		if !res.adoptSet && res.Mode == ModeOwn {
			res.Adopt = adopt
		}
		if !res.createOnceSet && res.Mode == ModeOwn {
			res.CreateOnce = createOnce
		}
	}
	d.noteCreateOnce(r)
	r.ForceConflicts = true
	if n, ok := f["forceConflicts"]; ok {
		r.ForceConflicts, _ = d.boolean(n, "spec.forceConflicts")
	}
	r.Workers = DefaultWorkers
	if n, ok := f["workers"]; ok {
		if v, ok := d.integer(n, "spec.workers"); ok {
			if v < 1 || v > maxWorkers {
				d.errorf(n, "spec.workers", "must be between 1 and %d, not %d", maxWorkers, v)
			}
			r.Workers = int(v)
		}
	}
	r.ResyncPeriod = DefaultResyncPeriod
	if n, ok := f["resyncPeriod"]; ok {
		if v, ok := d.duration(n, "spec.resyncPeriod"); ok {
			if v != 0 && v < minResyncPeriod {
				d.errorf(n, "spec.resyncPeriod", "must be 0 (off) or at least %v, not %v", minResyncPeriod, v)
			}
			r.ResyncPeriod = v
		}
	}
	r.RateLimit = RateLimit{BaseDelay: DefaultBaseDelay, MaxDelay: DefaultMaxDelay, QPS: DefaultQPS, Burst: DefaultBurst}
	if n, ok := f["rateLimit"]; ok {
		d.decodeRateLimit(&r.RateLimit, n)
	}
	r.RevisionHistoryLimit = DefaultRevisionHistoryLimit
	if n, ok := f["revisionHistoryLimit"]; ok {
		if v, ok := d.integer(n, "spec.revisionHistoryLimit"); ok {
			if v < 1 || v > maxRevisionHistoryLimit {
				d.errorf(n, "spec.revisionHistoryLimit", "must be between 1 (the revision in force) and %d, not %d", maxRevisionHistoryLimit, v)
			}
			r.RevisionHistoryLimit = int(v)
		}
	}
	r.Rollout = DefaultRollout
	if n, ok := f["rollout"]; ok {
		d.decodeRollout(&r.Rollout, n)
	}
	if n, ok := f["maxRetries"]; ok {
		if v, ok := d.integer(n, "spec.maxRetries"); ok {
			if v < 0 {
				d.errorf(n, "spec.maxRetries", "must be 0 (retry forever) or more, not %d", v)
			}
			r.MaxRetries = int(v)
		}
	}
}

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
		if id, t, ok := typeAt(m, []any{"template"}, fmt.Sprintf("spec.resources[%d].template", i), forEach); ok {
			ts.Children[id] = t
		}
	}
	return ts
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

func (d *decoder) decodeResource(i int, n *yaml.Node, docVal any, pos positions, c *expr.Compiler, scope expr.Scope, ids []string) *Resource {
	field := fmt.Sprintf("spec.resources[%d]", i)
	f := d.fields(n, field, RuleFormat.known("spec.resources")...)
	if f == nil {
		return nil
	}
	errsBefore := len(d.errs)
	res := &Resource{Index: i, ID: d.id(n, f, field, "resource", ids), Mode: ModeOwn, Pos: d.pos(resolve(n))}
	if nn, ok := f["mode"]; ok {
		if v, ok := d.oneOf(nn, field+".mode", string(ModeOwn), string(ModePatch)); ok {
			res.Mode = Mode(v)
		}
	}
	if nn, ok := f["deletionPolicy"]; ok {
		if v, ok := d.oneOf(nn, field+".deletionPolicy", string(DeletionDelete), string(DeletionOrphan)); ok {
			res.DeletionPolicy = DeletionPolicy(v)
		}
	}
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
	if nn, ok := f["forEach"]; ok {
		res.ForEach = d.expression(nn, field+".forEach", c, scope, expr.ListResult)
		res.Refs = append(res.Refs, d.exprRefs(nn, res.ForEach)...)
		scope.ForEach = true
		if res.ForEach != nil {
			scope.Item = res.ForEach.Elem()
		}
	}
	tn, ok := f["template"]
	if !ok {
		d.errorf(n, field+".template", "required")
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

// oneOf decodes a string that must be one of values.
func (d *decoder) oneOf(n *yaml.Node, field string, values ...string) (string, bool) {
	v, ok := d.str(n, field)
	if !ok {
		return "", false
	}
	if contains(values, v) {
		return v, true
	}
	d.errorf(n, field, "must be %s or %s, not %q", strings.Join(values[:len(values)-1], ", "), values[len(values)-1], v)
	return "", false
}

// id decodes the required id of a resource or lookup (what): a DNS-1123
// label not among ids. It returns "" when there is an error.
func (d *decoder) id(parent *yaml.Node, f map[string]*yaml.Node, field, what string, ids []string) string {
	nn, ok := f["id"]
	if !ok {
		d.errorf(parent, field+".id", "required")
		return ""
	}
	id, ok := d.str(nn, field+".id")
	switch {
	case !ok:
		return ""
	case len(validation.IsDNS1123Label(id)) > 0:
		d.errorf(nn, field+".id", "%q is not a valid %s id: %s", id, what, strings.Join(validation.IsDNS1123Label(id), "; "))
		return ""
	case contains(ids, id):
		d.errorf(nn, field+".id", "%s id %q used twice in this rule", what, id)
		return ""
	}
	return id
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

// expression compiles a CEL expression written as a YAML string.
func (d *decoder) expression(n *yaml.Node, field string, c *expr.Compiler, scope expr.Scope, want expr.Result) *Expression {
	src, ok := d.str(n, field)
	if !ok {
		return nil
	}
	n = resolve(n)
	prog, err := c.Compile(src, scope, want)
	if err != nil {
		ce, _ := err.(*expr.Error)
		off := -1
		msg := err.Error()
		if ce != nil {
			off, msg = ce.Offset, ce.Msg
		}
		d.errorAt(d.offsetPos(n, off), field, "%s", msg)
		return nil
	}
	return &Expression{Program: prog, Pos: d.pos(n), Field: field}
}

// template compiles the template at prefix in the document. Its strings'
// positions come from the document-wide positions map.
func (d *decoder) template(n *yaml.Node, prefix expr.Path, docVal any, pos positions, c *expr.Compiler, scope expr.Scope) *Template {
	val := lookup(docVal, prefix)
	t, errs := c.CompileTemplate(val, scope)
	field := PathField("", prefix)
	for _, e := range errs {
		full := append(append(expr.Path(nil), prefix...), e.Path...)
		p := d.pos(resolve(n))
		if sp, ok := pos[posKey(full, e.Key)]; ok {
			p = d.offsetPos(sp.node, e.Offset)
		}
		d.errorAt(p, PathField("", full), "%s", e.Msg)
	}
	if errs != nil {
		return nil
	}
	kept := make(map[string]Pos)
	for k, sp := range pos {
		if strings.HasPrefix(k, field) {
			kept[k] = sp.pos
		}
	}
	return &Template{Template: t, Pos: d.pos(resolve(n)), Field: field, prefix: prefix, positions: kept}
}

// lookup walks a decoded document along p.
func lookup(v any, p expr.Path) any {
	for _, e := range p {
		switch e := e.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[e]
		case int:
			l, _ := v.([]any)
			if e >= len(l) {
				return nil
			}
			v = l[e]
		}
	}
	return v
}

func (d *decoder) duration(n *yaml.Node, field string) (time.Duration, bool) {
	s, ok := d.str(n, field)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.errorf(n, field, "%q is not a duration (like 30s, 10m, 1h)", s)
		return 0, false
	}
	if v < 0 {
		d.errorf(n, field, "must not be negative")
		return 0, false
	}
	return v, true
}

func (d *decoder) decodeRateLimit(rl *RateLimit, n *yaml.Node) {
	const field = "spec.rateLimit"
	f := d.fields(n, field, RuleFormat.known("spec.rateLimit")...)
	if f == nil {
		return
	}
	if nn, ok := f["baseDelay"]; ok {
		if v, ok := d.duration(nn, field+".baseDelay"); ok {
			if v == 0 {
				d.errorf(nn, field+".baseDelay", "must be more than 0")
			}
			rl.BaseDelay = v
		}
	}
	if nn, ok := f["maxDelay"]; ok {
		if v, ok := d.duration(nn, field+".maxDelay"); ok {
			rl.MaxDelay = v
		}
	}
	if rl.MaxDelay < rl.BaseDelay {
		at := n
		if nn, ok := f["maxDelay"]; ok {
			at = nn
		}
		d.errorf(at, field+".maxDelay", "must be at least baseDelay (%v), not %v", rl.BaseDelay, rl.MaxDelay)
	}
	if nn, ok := f["qps"]; ok {
		if v, ok := d.number(nn, field+".qps"); ok {
			if v <= 0 {
				d.errorf(nn, field+".qps", "must be more than 0")
			}
			rl.QPS = v
		}
	}
	if nn, ok := f["burst"]; ok {
		if v, ok := d.integer(nn, field+".burst"); ok {
			if v < 1 {
				d.errorf(nn, field+".burst", "must be at least 1")
			}
			rl.Burst = int(v)
		}
	}
}
