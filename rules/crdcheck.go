package rules

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// CRDSource reads a cluster's CustomResourceDefinitions by name: nil and
// no error when there is none.
type CRDSource interface {
	CRD(name string) (*unstructured.Unstructured, error)
}

// UseServedCRDs makes later loads check each kind a rule defines against
// the CRD src has of it. With manage (syncloop keeps the CRDs), a CRD
// that is not syncloop's, or a change its objects cannot follow — a
// breaking change — is an error of the rule, so that the rule keeps its
// last good version; without, any difference between the served CRD and
// the one the rule generates is.
func (l *Loader) UseServedCRDs(src CRDSource, manage bool) {
	l.crds, l.manageCRDs = src, manage
}

// checkServedCRD checks the kind r defines against the served CRD.
func (d *decoder) checkServedCRD(r *Rule) {
	if d.crds == nil {
		return
	}
	a := r.API
	served, err := d.crds.CRD(a.CRDName())
	if err != nil {
		d.errorAt(a.Pos, "spec.api", "reading CustomResourceDefinition %s: %v", a.CRDName(), err)
		d.errs[len(d.errs)-1].Err = &Retryable{Err: err} // the cluster's, not the file's: it may load when tried again
		return
	}
	if served == nil {
		return
	}
	if !d.manageCRDs {
		if diffs := CRDDiff(served, r.CRD()); len(diffs) > 0 {
			d.errorAt(a.Pos, "spec.api", "the served CustomResourceDefinition %s differs from the one the rule defines (syncloop crds prints it; --manage-crds=false leaves it to you): %s",
				a.CRDName(), strings.Join(diffs, "; "))
		}
		return
	}
	if !r.OwnsCRD(served) {
		d.errorAt(a.Pos, "spec.api", "CustomResourceDefinition %s exists and is not this installation's of syncloop: syncloop never takes over a CRD it did not create (annotate it %s=%s to hand it to this rule, or run with --manage-crds=false)",
			a.CRDName(), AnnotationAdopt, r.Name)
		return
	}
	forward := "add a field instead, or define a new kind"
	if v := a.Version; v != nil && !a.Converts() {
		forward = fmt.Sprintf("add a field instead, or list a new version %s with this schema in spec.api.versions beside %s as it was, with a conversion between them: docs/rules.md, \"Evolving an API\"",
			nextVersion(v.Name), v.Name)
	}
	for _, c := range breakingChanges(served, a) {
		if c.field == "spec.api.apiVersion" {
			d.errorAt(c.pos, c.field, "breaking change to the served CustomResourceDefinition %s: %s", a.CRDName(), c.msg)
			continue
		}
		d.errorAt(c.pos, c.field, "breaking change to the served CustomResourceDefinition %s: %s: the objects it serves could not follow (%s)",
			a.CRDName(), c.msg, forward)
	}
}

// OwnsCRD reports whether a served CRD is r's to change (see
// UseServedCRDs): made by this installation of syncloop, or handed to the
// rule by its adopt annotation.
func (r *Rule) OwnsCRD(served *unstructured.Unstructured) bool {
	l := served.GetLabels()
	if l[LabelManagedBy] == ManagedByValue && l[LabelInstallation] == r.Installation {
		return true
	}
	return served.GetAnnotations()[AnnotationAdopt] == r.Name
}

// change is one breaking change, at the field of the rule that makes it.
type change struct {
	pos   Pos
	field string
	msg   string
}

// breakingChanges are the changes from the served CRD to a's that its
// existing objects could not follow: the kind or scope changed, the
// version changed, a field removed or retyped, a new required field
// without a default, an enum narrowed.
func breakingChanges(served *unstructured.Unstructured, a *API) []change {
	var crd apiextv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(served.Object, &crd); err != nil {
		return []change{{a.Pos, "spec.api", fmt.Sprintf("the served CRD does not decode: %v", err)}}
	}
	var out []change
	if k := crd.Spec.Names.Kind; k != a.Kind {
		out = append(out, change{a.FieldPos("kind"), "spec.api.kind", fmt.Sprintf("the kind changed from %s to %s", k, a.Kind)})
	}
	if s := crd.Spec.Scope; (s == apiextv1.NamespaceScoped) != a.Namespaced {
		out = append(out, change{a.FieldPos("scope"), "spec.api.scope", fmt.Sprintf("the scope changed from %s", s)})
	}
	stored := crd.Status.StoredVersions
	if len(stored) == 0 { // not read from an API server: its storage version
		for _, sv := range crd.Spec.Versions {
			if sv.Storage {
				stored = append(stored, sv.Name)
			}
		}
	}
	servesRead := slices.ContainsFunc(crd.Spec.Versions, func(sv apiextv1.CustomResourceDefinitionVersion) bool { return sv.Name == a.GVK.Version })
	for _, sv := range crd.Spec.Versions {
		v := a.VersionNamed(sv.Name)
		if v == nil {
			if slices.Contains(stored, sv.Name) {
				out = append(out, change{a.FieldPos("apiVersion"), "spec.api.apiVersion", removedVersion(a, sv.Name, stored, servesRead)})
			}
			continue
		}
		if sv.Schema == nil || sv.Schema.OpenAPIV3Schema == nil {
			continue
		}
		old, err := schemaOf(sv.Schema.OpenAPIV3Schema.Properties["spec"])
		if err != nil {
			out = append(out, change{v.Pos, v.field, fmt.Sprintf("the served schema of %s does not decode: %v", v.Name, err)})
			continue
		}
		compareSchemas(v, old, v.Spec, "spec", &out)
	}
	return out
}

// removedVersion says why version name, which objects are stored in, may
// not leave the kind yet, and what to do instead; servesRead is whether
// the served CRD has the version the rule reads already.
func removedVersion(a *API, name string, stored []string, servesRead bool) string {
	if !a.Converts() && !servesRead {
		return fmt.Sprintf("the kind served %s and objects are stored in it: to serve %s, list both in spec.api.versions, with a conversion between them (docs/rules.md, \"Evolving an API\")",
			name, a.GVK.Version)
	}
	return fmt.Sprintf("version %s is removed while objects may still be stored in it (status.storedVersions: %s): keep it, served or not, until syncloop has moved them to %s, the storage version",
		name, strings.Join(stored, ", "), a.StorageVersion().Name)
}

// nextVersion is the version after name: v1alpha1 → v1alpha2, v1 → v2.
func nextVersion(name string) string {
	i := len(name)
	for i > 0 && name[i-1] >= '0' && name[i-1] <= '9' {
		i--
	}
	n, err := strconv.Atoi(name[i:])
	if err != nil {
		return name + "2"
	}
	return name[:i] + strconv.Itoa(n+1)
}

func schemaOf(p apiextv1.JSONSchemaProps) (*spec.Schema, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	s := &spec.Schema{}
	return s, json.Unmarshal(data, s)
}

// compareSchemas adds the breaking changes from old to new, the schemas
// of the field at path.
func compareSchemas(a *Version, old, new *spec.Schema, path string, out *[]change) {
	add := func(p, format string, args ...any) {
		*out = append(*out, change{a.FieldPos(p), a.field + "." + p, fmt.Sprintf(format, args...)})
	}
	if ot, nt := schemaKind(old), schemaKind(new); ot != nt {
		add(path, "%s is retyped from %s to %s", path, ot, nt)
		return
	}
	for _, name := range slices.Sorted(maps.Keys(old.Properties)) {
		o := old.Properties[name]
		n, ok := new.Properties[name]
		if !ok {
			add(path, "field %s.%s is removed", path, name)
			continue
		}
		compareSchemas(a, &o, &n, path+"."+name, out)
	}
	for _, name := range new.Required {
		if slices.Contains(old.Required, name) {
			continue
		}
		if p := new.Properties[name]; p.Default == nil {
			add(path+"."+name, "%s.%s is newly required and has no default: objects without it would be refused on their next update", path, name)
		}
	}
	if old.Items != nil && old.Items.Schema != nil && new.Items != nil && new.Items.Schema != nil {
		compareSchemas(a, old.Items.Schema, new.Items.Schema, path, out)
	}
	if old.AdditionalProperties != nil && old.AdditionalProperties.Schema != nil && new.AdditionalProperties != nil && new.AdditionalProperties.Schema != nil {
		compareSchemas(a, old.AdditionalProperties.Schema, new.AdditionalProperties.Schema, path, out)
	}
	if len(new.Enum) > 0 {
		var dropped []string
		for _, v := range old.Enum {
			if !slices.ContainsFunc(new.Enum, func(n any) bool { return fmt.Sprint(n) == fmt.Sprint(v) }) {
				dropped = append(dropped, fmt.Sprint(v))
			}
		}
		switch {
		case len(old.Enum) == 0:
			add(path, "%s gains an enum: values it held before may be outside it", path)
		case len(dropped) > 0:
			add(path, "the enum of %s is narrowed: %s no longer allowed", path, strings.Join(dropped, ", "))
		}
	}
}

// schemaKind names what a schema holds, for comparing types: a list, a
// map and an object are different types.
func schemaKind(s *spec.Schema) string {
	switch {
	case s.Extensions["x-kubernetes-int-or-string"] == true:
		return "int-or-string"
	case len(s.Type) == 0:
		return "any value"
	case s.Type[0] == "object" && s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil:
		return "map[string]" + schemaKind(s.AdditionalProperties.Schema)
	case s.Type[0] == "object" && len(s.Properties) == 0 && s.Extensions["x-kubernetes-preserve-unknown-fields"] == true:
		return "object"
	case s.Type[0] == "object":
		return "an object of fields"
	case s.Type[0] == "array" && s.Items != nil && s.Items.Schema != nil:
		return "[]" + schemaKind(s.Items.Schema)
	}
	return s.Type[0]
}

// CRDDiff lists how served differs from want, a CRD a rule generates, in
// what the rule decides: names, scope, the version's schema,
// subresources and printer columns (not labels: a CRD installed by others
// carries theirs). Empty: the served CRD serves the rule's kind as the
// rule defines it.
func CRDDiff(served, want *unstructured.Unstructured) []string {
	var s, w apiextv1.CustomResourceDefinition
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(served.Object, &s); err != nil {
		return []string{fmt.Sprintf("the served CRD does not decode: %v", err)}
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(want.Object, &w); err != nil {
		return []string{fmt.Sprintf("the generated CRD does not decode: %v", err)}
	}
	var out []string
	differ := func(what string, a, b any) {
		if !equality.Semantic.DeepEqual(a, b) {
			out = append(out, fmt.Sprintf("%s: %s", what, jsonDiff(a, b)))
		}
	}
	differ("group", s.Spec.Group, w.Spec.Group)
	s.Spec.Names.ListKind = w.Spec.Names.ListKind // defaulted by the API server
	differ("names", s.Spec.Names, w.Spec.Names)
	differ("scope", s.Spec.Scope, w.Spec.Scope)
	servedVersions := map[string]apiextv1.CustomResourceDefinitionVersion{}
	for _, v := range s.Spec.Versions {
		servedVersions[v.Name] = v
	}
	for _, wv := range w.Spec.Versions {
		sv, ok := servedVersions[wv.Name]
		if !ok {
			out = append(out, fmt.Sprintf("version %s is not served", wv.Name))
			continue
		}
		delete(servedVersions, wv.Name)
		at := ""
		if len(w.Spec.Versions) > 1 {
			at = wv.Name + " "
		}
		differ(at+"schema", sv.Schema, wv.Schema)
		differ(at+"subresources", sv.Subresources, wv.Subresources)
		differ(at+"printer columns", sv.AdditionalPrinterColumns, wv.AdditionalPrinterColumns)
		differ(at+"served, storage, deprecated", []any{sv.Served, sv.Storage, sv.Deprecated, sv.DeprecationWarning},
			[]any{wv.Served, wv.Storage, wv.Deprecated, wv.DeprecationWarning})
	}
	for _, name := range slices.Sorted(maps.Keys(servedVersions)) {
		out = append(out, fmt.Sprintf("version %s is served but not defined", name))
	}
	differ("conversion", conversionOf(s.Spec.Conversion, w.Spec.Conversion), conversionOf(w.Spec.Conversion, nil))
	return out
}

// conversionOf is c as CRDDiff compares it: the strategy and where the
// webhook is; its CA bundle only when want (the generated one) has one,
// for a CA bundle another keeps (cert-manager's) is not the rule's.
func conversionOf(c, want *apiextv1.CustomResourceConversion) any {
	if c == nil || c.Strategy == "" || c.Strategy == apiextv1.NoneConverter {
		return "None"
	}
	out := map[string]any{"strategy": c.Strategy}
	if c.Webhook != nil && c.Webhook.ClientConfig != nil {
		cc := *c.Webhook.ClientConfig
		if want != nil && (want.Webhook == nil || want.Webhook.ClientConfig == nil || len(want.Webhook.ClientConfig.CABundle) == 0) {
			cc.CABundle = nil
		}
		out["clientConfig"] = cc
	}
	return out
}

// jsonDiff names the first paths at which a and b, as JSON, differ.
func jsonDiff(a, b any) string {
	var x, y any
	da, _ := json.Marshal(a)
	db, _ := json.Marshal(b)
	_ = json.Unmarshal(da, &x)
	_ = json.Unmarshal(db, &y)
	var paths []string
	walkDiff(x, y, "", &paths)
	if len(paths) > 5 {
		paths = append(paths[:5], fmt.Sprintf("and %d more", len(paths)-5))
	}
	return strings.Join(paths, ", ")
}

func walkDiff(x, y any, path string, out *[]string) {
	at := func(p string) string {
		if p == "" {
			return "(the whole)"
		}
		return strings.TrimPrefix(p, ".")
	}
	xm, xok := x.(map[string]any)
	ym, yok := y.(map[string]any)
	if xok && yok {
		keys := map[string]bool{}
		for k := range xm {
			keys[k] = true
		}
		for k := range ym {
			keys[k] = true
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Strings(sorted)
		for _, k := range sorted {
			xv, inX := xm[k]
			yv, inY := ym[k]
			switch {
			case !inX:
				*out = append(*out, at(path+"."+k)+" is not served")
			case !inY:
				*out = append(*out, at(path+"."+k)+" is served but not defined")
			default:
				walkDiff(xv, yv, path+"."+k, out)
			}
		}
		return
	}
	xd, _ := json.Marshal(x)
	yd, _ := json.Marshal(y)
	if string(xd) != string(yd) {
		*out = append(*out, fmt.Sprintf("%s is %s, not %s", at(path), xd, yd))
	}
}
