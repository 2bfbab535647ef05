package rules

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/rules/expr"
)

// API is the kind a rule defines and serves (spec.api). The rule watches
// it; syncloop generates its CustomResourceDefinition (CRD) from the spec
// schema here and the status the rule writes, and keeps it in the
// cluster. It is immutable once loaded.
type API struct {
	KindRef
	// Pos is where spec.api is written.
	Pos        Pos
	Namespaced bool
	Plural     string
	Singular   string
	ShortNames []string
	Categories []string
	// Versions are the kind's versions, in the order written: one unless
	// spec.api.versions lists more. Version is the one the rule reads
	// (apiVersion's), its templates typed by its schema.
	Versions []*Version
	Version  *Version
	// Status is the schema of its status, the same in every version: the
	// types of what the rule's status template renders, and the
	// conditions syncloop keeps.
	Status *spec.Schema
	// at is where apiVersion, kind and scope are written.
	at map[string]Pos
	// webhook is where the API server reaches syncloop to convert the
	// kind's objects between versions.
	webhook ConversionWebhook
	// source is spec.api as JSON: a CRD that converts carries it
	// (AnnotationConversion), so that its conversion outlives the rule.
	source []byte
}

// PrinterColumn is a column `kubectl get` shows for the kind.
type PrinterColumn struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	Format      string `json:"format,omitempty"`
	Description string `json:"description,omitempty"`
	Priority    int32  `json:"priority,omitempty"`
	JSONPath    string `json:"jsonPath"`
}

// GroupResource is the resource that serves the kind.
func (a *API) GroupResource() schema.GroupResource {
	return schema.GroupResource{Group: a.GVK.Group, Resource: a.Plural}
}

// CRDName is the name of the kind's CustomResourceDefinition:
// <plural>.<group>.
func (a *API) CRDName() string { return a.Plural + "." + a.GVK.Group }

// FieldPos is where apiVersion, kind or scope is written, or the field
// of the rule's version at path ("spec.ingress.host") is declared.
func (a *API) FieldPos(path string) Pos {
	if pos, ok := a.at[path]; ok {
		return pos
	}
	if a.Version != nil {
		return a.Version.FieldPos(path)
	}
	return a.Pos
}

// Default sets the fields of obj that the schema of the rule's version
// defaults and obj leaves out, as the API server does when it reads or
// creates an object.
func (a *API) Default(obj map[string]any) {
	if a.Version != nil {
		a.Version.Default(obj)
	}
}

var (
	kindPattern       = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	columnTypes       = []string{"string", "integer", "number", "boolean", "date"}
	validationReasons = []string{"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}
)

// decodeAPI decodes spec.api: the kind, its names and scope, the schema
// of its spec (status comes later, from the status template), its
// validations and printer columns. nil when it has errors.
func (d *decoder) decodeAPI(n *yaml.Node) *API {
	const field = "spec.api"
	errsBefore := len(d.errs)
	f := d.fields(n, field, RuleFormat.known(field)...)
	if f == nil {
		return nil
	}
	a := &API{Pos: d.pos(resolve(n)), Namespaced: true, at: map[string]Pos{}, webhook: d.webhook.orDefault(d.identities.home)}
	a.APIVersion, a.Kind = d.apiVersionKind(n, f, field)
	var src any
	if err := resolve(n).Decode(&src); err == nil {
		a.source, _ = json.Marshal(src)
	}
	for _, key := range []string{"apiVersion", "kind", "scope"} {
		if kn, ok := f[key]; ok {
			a.at[key] = d.pos(resolve(kn))
		}
	}
	if gv, err := schema.ParseGroupVersion(a.APIVersion); err == nil && a.APIVersion != "" {
		a.GVK = gv.WithKind(a.Kind)
		at := f["apiVersion"]
		switch {
		case gv.Group == "" || !strings.Contains(gv.Group, "."):
			d.errorf(at, field+".apiVersion", "%q: a custom kind's group is a domain with a dot, e.g. example.com/v1", a.APIVersion)
		case len(validation.IsDNS1123Subdomain(gv.Group)) > 0:
			d.errorf(at, field+".apiVersion", "group %q is not a DNS subdomain: %s", gv.Group, strings.Join(validation.IsDNS1123Subdomain(gv.Group), "; "))
		case len(validation.IsDNS1035Label(gv.Version)) > 0:
			d.errorf(at, field+".apiVersion", "version %q is not a version such as v1 or v1alpha1", gv.Version)
		case strings.HasSuffix(gv.Group, ".k8s.io") || gv.Group == "k8s.io" || gv.Group == Group:
			d.errorf(at, field+".apiVersion", "group %q is reserved: Kubernetes' groups and syncloop's own are not a rule's to define", gv.Group)
		}
	}
	if a.Kind != "" && (!kindPattern.MatchString(a.Kind) || len(a.Kind) > 63) {
		d.errorf(f["kind"], field+".kind", "%q is not a kind: CamelCase letters and digits, starting with an upper-case letter, at most 63", a.Kind)
	}
	if sn, ok := f["scope"]; ok {
		if v, ok := d.oneOf(sn, field+".scope", "Namespaced", "Cluster"); ok {
			a.Namespaced = v == "Namespaced"
		}
	}
	d.decodeAPINames(a, f)
	if vn, ok := f["versions"]; ok {
		for _, key := range []string{"spec", "types", "validations", "printerColumns"} {
			if kn, _ := entry(n, key); kn != nil {
				d.errorf(kn, field+"."+key, "with spec.api.versions, each version has its own %s", key)
			}
		}
		d.decodeVersions(a, vn)
	} else {
		v := &Version{Name: a.GVK.Version, Pos: a.Pos, Served: true, Storage: true}
		d.decodeVersionFields(v, n, f, field, field)
		a.Versions, a.Version = []*Version{v}, v
	}
	if len(d.errs) > errsBefore {
		return nil
	}
	return a
}

// decodeAPINames decodes plural, singular, shortNames and categories,
// deriving what is left out from the kind.
func (d *decoder) decodeAPINames(a *API, f map[string]*yaml.Node) {
	name := func(key string) string {
		n, ok := f[key]
		if !ok {
			return ""
		}
		v, ok := d.str(n, "spec.api."+key)
		if ok && (len(validation.IsDNS1035Label(v)) > 0 || strings.ToLower(v) != v) {
			d.errorf(n, "spec.api."+key, "%q is not a resource name: lower-case letters, digits and '-', starting with a letter", v)
		}
		return v
	}
	a.Plural, a.Singular = name("plural"), name("singular")
	if a.Kind != "" {
		guess, singular := meta.UnsafeGuessKindToResource(schema.GroupVersionKind{Kind: a.Kind})
		if a.Plural == "" {
			a.Plural = guess.Resource
			// UnsafeGuessKindToResource makes Gateway gatewaies.
			if l := strings.ToLower(a.Kind); len(l) > 1 && strings.HasSuffix(l, "y") && strings.ContainsRune("aeiou", rune(l[len(l)-2])) {
				a.Plural = l + "s"
			}
		}
		if a.Singular == "" {
			a.Singular = singular.Resource
		}
	}
	list := func(key string) []string {
		n, ok := f[key]
		if !ok {
			return nil
		}
		var out []string
		for i, e := range d.seq(n, "spec.api."+key) {
			at := fmt.Sprintf("spec.api.%s[%d]", key, i)
			v, ok := d.str(e, at)
			switch {
			case !ok:
			case len(validation.IsDNS1035Label(v)) > 0 || strings.ToLower(v) != v:
				d.errorf(e, at, "%q is not a name kubectl can take: lower-case letters, digits and '-', starting with a letter", v)
			case slices.Contains(out, v):
				d.errorf(e, at, "%q is listed twice", v)
			default:
				out = append(out, v)
			}
		}
		return out
	}
	a.ShortNames, a.Categories = list("shortNames"), list("categories")
	if a.Plural != "" && a.GVK.Group != "" && len(a.CRDName()) > 253 {
		d.errorAt(a.Pos, "spec.api", "the CustomResourceDefinition's name %q is longer than 253 characters", a.CRDName())
	}
}

// entry is the key and value nodes of key in mapping n; nil when n is
// not a mapping or has no such key.
func entry(n *yaml.Node, key string) (k, v *yaml.Node) {
	n = resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := resolve(n.Content[i]); k.Value == key {
			return k, n.Content[i+1]
		}
	}
	return nil, nil
}

// apiFieldPositions records where the fields of the spec mapping n, at
// path in the object, are declared: the errors of a breaking change name
// them.
func (d *decoder) apiFieldPositions(a *Version, n *yaml.Node, path string) {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		return
	}
	a.at[path] = d.pos(n)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := resolve(n.Content[i])
		p := path + "." + k.Value
		a.at[p] = d.pos(k)
		if v := resolve(n.Content[i+1]); v.Kind == yaml.MappingNode {
			d.apiFieldPositions(a, v, p)
		}
	}
}

// decodeValidations adds spec.api.validations to the spec's schema as
// x-kubernetes-validations, and returns the nodes of their rules;
// checkAPI compiles them.
func (d *decoder) decodeValidations(s *spec.Schema, n *yaml.Node, field, format string) []*yaml.Node {
	var nodes []*yaml.Node
	for i, vn := range d.seq(n, field) {
		at := fmt.Sprintf("%s[%d]", field, i)
		vf := d.fields(vn, at, RuleFormat.known(format)...)
		if vf == nil {
			continue
		}
		rule := map[string]any{}
		for _, key := range []string{"rule", "message", "messageExpression", "reason", "fieldPath"} {
			kn, ok := vf[key]
			if !ok {
				continue
			}
			if v, ok := d.str(kn, at+"."+key); ok {
				rule[key] = v
			}
		}
		if _, ok := vf["rule"]; !ok {
			d.errorf(vn, at+".rule", "required: a CEL expression over self, the spec")
		}
		nodes = append(nodes, resolve(vf["rule"]))
		if r, ok := rule["reason"].(string); ok && !slices.Contains(validationReasons, r) {
			d.errorf(vf["reason"], at+".reason", "%q is not a reason: one of %s", r, strings.Join(validationReasons, ", "))
		}
		if p, ok := rule["fieldPath"].(string); ok && !strings.HasPrefix(p, ".") {
			d.errorf(vf["fieldPath"], at+".fieldPath", "%q: a field path starts with a dot, e.g. .replicas", p)
		}
		ext := spec.Extensions{}
		for k, v := range s.Extensions {
			ext[k] = v
		}
		rules, _ := ext["x-kubernetes-validations"].([]any)
		ext["x-kubernetes-validations"] = append(rules, rule)
		s.Extensions = ext
	}
	return nodes
}

// decodeColumns decodes spec.api.printerColumns.
func (d *decoder) decodeColumns(n *yaml.Node, field, format string) []PrinterColumn {
	var out []PrinterColumn
	for i, cn := range d.seq(n, field) {
		at := fmt.Sprintf("%s[%d]", field, i)
		cf := d.fields(cn, at, RuleFormat.known(format)...)
		if cf == nil {
			continue
		}
		var c PrinterColumn
		str := func(key string, required bool) string {
			kn, ok := cf[key]
			if !ok {
				if required {
					d.errorf(cn, at+"."+key, "required")
				}
				return ""
			}
			v, _ := d.str(kn, at+"."+key)
			return v
		}
		c.Name, c.JSONPath, c.Description, c.Format = str("name", true), str("jsonPath", true), str("description", false), str("format", false)
		if tn, ok := cf["type"]; !ok {
			d.errorf(cn, at+".type", "required: one of %s", strings.Join(columnTypes, ", "))
		} else if v, ok := d.oneOf(tn, at+".type", columnTypes...); ok {
			c.Type = v
		}
		if c.JSONPath != "" && !strings.HasPrefix(c.JSONPath, ".") {
			d.errorf(cf["jsonPath"], at+".jsonPath", "%q: a column's path starts with a dot, e.g. .spec.replicas", c.JSONPath)
		}
		if pn, ok := cf["priority"]; ok {
			if v, ok := d.integer(pn, at+".priority"); ok {
				if v < 0 || v > 1<<31-1 {
					d.errorf(pn, at+".priority", "must be 0 or more")
				}
				c.Priority = int32(v)
			}
		}
		for _, prev := range out {
			if strings.EqualFold(prev.Name, c.Name) {
				d.errorf(cf["name"], at+".name", "column %q given twice", c.Name)
			}
		}
		if strings.EqualFold(c.Name, "Name") {
			d.errorf(cf["name"], at+".name", "kubectl always shows NAME first: name the column otherwise")
		}
		out = append(out, c)
	}
	return out
}

// finishAPI completes the kind a rule defines once the rule's status is
// compiled: such a rule always writes status — the Ready condition at
// least, so that `kubectl wait --for=condition=Ready` works — its schema
// is typed from the status template, and the whole is checked as the API
// server will check it.
func (d *decoder) finishAPI(r *Rule, docVal any, c *expr.Compiler) {
	if r.Status == nil {
		t, errs := c.CompileTemplate(map[string]any{}, expr.Scope{})
		if len(errs) > 0 {
			d.errorAt(r.API.Pos, "spec.status", "internal: an empty status does not compile: %s", errs[0].Msg)
			return
		}
		r.Status = &StatusTemplate{Template: &Template{Template: t, Pos: r.API.Pos, Field: "spec.status", prefix: expr.Path{"spec", "status"}}}
	}
	r.API.Status = d.statusSchema(r, docVal)
	d.checkAPI(r.API)
}
