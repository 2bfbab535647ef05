package rules

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/rules/expr"
	kinds "github.com/syncloop/syncloop/rules/schema"
)

// decodeConversions compiles the conversions of each version of the kind
// (n is spec.api) to and from the hub, and checks each is
// complete: every field of the version converted to is written by the
// template, copied from a field of the same name and shape, or declared
// lossy; a required one is never lossy.
func (d *decoder) decodeConversions(a *API, n *yaml.Node, docVal any, pos positions, c *expr.Compiler) {
	_, vs := entry(n, "versions")
	if vs == nil {
		return
	}
	hub := a.Hub()
	for i, vn := range d.seq(vs, "spec.api.versions") {
		if i >= len(a.Versions) {
			break
		}
		v := a.Versions[i]
		prefix := expr.Path{"spec", "api", "versions", i}
		field := fmt.Sprintf("spec.api.versions[%d]", i)
		to, toN := entry(vn, "toHub")
		from, fromN := entry(vn, "fromHub")
		if v == hub {
			for _, k := range []*yaml.Node{to, from} {
				if k != nil {
					d.errorf(k, field+"."+k.Value, "%s", hubError(a, v))
				}
			}
			continue
		}
		at := d.pos(resolve(vn))
		v.ToHub = d.conversion(a, v, hub, toN, at, prefix.With("toHub"), field+".toHub", docVal, pos, c)
		v.FromHub = d.conversion(a, hub, v, fromN, at, prefix.With("fromHub"), field+".fromHub", docVal, pos, c)
	}
}

// hubError says why the hub v has no conversions, and, when it is the
// hub for being the storage version, how to keep them.
func hubError(a *API, v *Version) string {
	if v.Hub {
		return fmt.Sprintf("%s is the hub: the other versions convert to and from it", v.Name)
	}
	return fmt.Sprintf("%s is the hub, being the storage version and no version marked hub: true: the other versions convert to and from it "+
		"(moving the storage version to %s? mark the version these conversions go to and from hub: true, and they stay as they are)", v.Name, v.Name)
}

// conversion compiles one conversion, written at n (nil: not written, so
// only copying fields; at is then the version's position).
func (d *decoder) conversion(a *API, from, to *Version, n *yaml.Node, at Pos, prefix expr.Path, field string, docVal any, pos positions, c *expr.Compiler) *Conversion {
	conv := &Conversion{From: from, To: to, Pos: at}
	if n != nil {
		conv.Pos = d.pos(resolve(n))
		f := d.fields(n, field, RuleFormat.known("spec.api.versions.toHub")...)
		if f == nil {
			return conv
		}
		if sn, ok := f["spec"]; ok {
			if resolve(sn).Kind != yaml.MappingNode {
				d.errorf(sn, field+".spec", "must be a mapping of the fields of %s's spec, not %s", to.Name, kindName(resolve(sn)))
				return conv
			}
			scope := expr.Scope{Types: &expr.Types{Object: d.versionType(c, a, from), Lookups: map[string]*expr.Type{}, Children: map[string]*expr.Type{}}}
			conv.spec = d.template(sn, prefix.With("spec"), docVal, pos, c, scope)
			if conv.spec == nil {
				return conv
			}
			d.checkSchema(to.Spec, prefix.With("spec"), docVal, conv.spec, fmt.Sprintf("%s %s's spec", a.Kind, to.Name), false)
			conv.produced = producedPaths(lookup(docVal, prefix.With("spec")), "spec")
		}
		if ln, ok := f["lossy"]; ok {
			for i, e := range d.seq(ln, field+".lossy") {
				p, ok := d.str(e, fmt.Sprintf("%s.lossy[%d]", field, i))
				if !ok {
					continue
				}
				if schemaAt(to.Spec, "spec", p) == nil {
					d.errorf(e, fmt.Sprintf("%s.lossy[%d]", field, i), "%s has no field %s: a lossy field is one of the version converted to, e.g. spec.ports", to.Name, p)
				}
				conv.lossy = append(conv.lossy, p)
			}
		}
	}
	d.checkComplete(conv, from.Spec, to.Spec, "spec", field)
	return conv
}

// versionType is the CEL type of the objects of version v.
func (d *decoder) versionType(c *expr.Compiler, a *API, v *Version) *expr.Type {
	root := a.root(v)
	root.Properties["apiVersion"] = *spec.StringProperty()
	root.Properties["kind"] = *spec.StringProperty()
	root.Properties["metadata"] = kinds.Builtin().Schema(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}).Properties["metadata"]
	return c.KindType(a.GVK.Group+"/"+v.Name+"."+a.Kind, root)
}

// checkComplete reports each field of to (at path) the conversion leaves
// without a value it declared.
func (d *decoder) checkComplete(conv *Conversion, from, to *spec.Schema, path, field string) {
	for _, name := range slices.Sorted(maps.Keys(to.Properties)) {
		p := path + "." + name
		ts := to.Properties[name]
		fs, inFrom := from.Properties[name]
		required := slices.Contains(to.Required, name) && ts.Default == nil
		switch {
		case produces(conv.produced, p), inFrom && sameShape(&fs, &ts):
		case inFrom && hasFields(&fs) && hasFields(&ts):
			d.checkComplete(conv, &fs, &ts, p, field)
		case required:
			d.errorAt(conv.Pos, field+".spec", "%s is required in %s and nothing produces it from %s (no field of the same name and type): write it in %s.spec", p, conv.To.Name, conv.From.Name, field)
		case produces(conv.lossy, p):
		default:
			d.errorAt(conv.Pos, field+".spec", "%s of %s is produced by nothing from %s (no field of the same name and type): write it in %s.spec, or list it in %s.lossy", p, conv.To.Name, conv.From.Name, field, field)
		}
	}
}

// producedPaths are the fields (at path) a template value v writes: a
// mapping's fields one by one, anything else whole.
func producedPaths(v any, path string) []string {
	m, ok := v.(map[string]any)
	if !ok {
		return []string{path}
	}
	var out []string
	for k, e := range m {
		if strings.Contains(k, "${") {
			return []string{path}
		}
		out = append(out, producedPaths(e, path+"."+k)...)
	}
	return out
}

// schemaAt is the schema of the field p ("spec.a.b") in s, the schema at
// root; nil when s has no such field.
func schemaAt(s *spec.Schema, root, p string) *spec.Schema {
	rest, ok := strings.CutPrefix(p, root)
	if !ok {
		return nil
	}
	for _, name := range strings.Split(strings.TrimPrefix(rest, "."), ".") {
		if name == "" {
			return s
		}
		f, ok := s.Properties[name]
		if !ok {
			return nil
		}
		s = &f
	}
	return s
}
