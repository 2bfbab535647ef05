package rules

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A resource's template names its kind literally, or computes it — its
// apiVersion or kind holds ${} — and then lists every kind it may render
// in the resource's kinds: what the rule may make is known when it loads,
// so that its watches, the chart's RBAC, the scope and tenant checks and
// the type checks of the template cover each. A rendered kind outside the
// list fails that trigger (render.checkKind).

// computedKind reports whether the template's apiVersion or kind (its top
// fields tf) is computed.
func computedKind(tf map[string]*yaml.Node) bool {
	for _, key := range []string{"apiVersion", "kind"} {
		if n, ok := tf[key]; ok && resolve(n).Kind == yaml.ScalarNode && strings.Contains(resolve(n).Value, "${") {
			return true
		}
	}
	return false
}

// decodeKind sets the kind of resource res from its template (tn, top
// fields tf) — or, computed, its kinds from f["kinds"].
func (d *decoder) decodeKind(res *Resource, n, tn *yaml.Node, f, tf map[string]*yaml.Node, field string) {
	kn, listed := f["kinds"]
	if !computedKind(tf) {
		if listed {
			d.errorf(kn, field+".kinds", "only for a template whose apiVersion or kind is computed (${}): this one's is %s %s", literalOf(tf, "apiVersion"), literalOf(tf, "kind"))
		}
		res.APIVersion, res.Kind = d.apiVersionKind(tn, tf, field+".template")
		if gv, err := schema.ParseGroupVersion(res.APIVersion); err == nil && res.Kind != "" {
			res.GVK = gv.WithKind(res.Kind)
			res.Kinds = []KindRef{res.KindRef}
		}
		return
	}
	switch {
	case !listed:
		d.errorf(tn, field+".kinds", "required: the template's apiVersion or kind is computed, so list every kind it may render ({apiVersion, kind} each)")
		return
	case res.Mode == ModePatch:
		d.errorf(kn, field+".kinds", "a mode: patch resource names the kind it patches literally")
		return
	}
	d.decodeKindList(res, kn, field)
}

// decodeKindList decodes the kinds a resource lists (kn, at
// field.kinds): those a computed template or a function may make.
func (d *decoder) decodeKindList(res *Resource, kn *yaml.Node, field string) {
	res.Kinds = append(res.Kinds, d.kindList(kn, field)...)
}

// kindList decodes the kinds at field.kinds (kn): {apiVersion, kind}
// each, at least one, none twice.
func (d *decoder) kindList(kn *yaml.Node, field string) []KindRef {
	var out []KindRef
	errsBefore := len(d.errs)
	for i, en := range d.seq(kn, field+".kinds") {
		ef := fmt.Sprintf("%s.kinds[%d]", field, i)
		kf := d.fields(en, ef, "apiVersion", "kind")
		if kf == nil {
			continue
		}
		k := KindRef{}
		k.APIVersion, k.Kind = d.apiVersionKind(en, kf, ef)
		gv, err := schema.ParseGroupVersion(k.APIVersion)
		if err != nil || k.Kind == "" {
			continue
		}
		k.GVK = gv.WithKind(k.Kind)
		if slices.ContainsFunc(out, func(o KindRef) bool { return o.GVK == k.GVK }) {
			d.errorf(en, ef, "%s %s is listed twice", k.APIVersion, k.Kind)
			continue
		}
		out = append(out, k)
	}
	if len(out) == 0 && len(d.errs) == errsBefore {
		d.errorf(kn, field+".kinds", "must list at least one kind")
	}
	return out
}

// literalOf is the literal string at key of a template's top fields.
func literalOf(tf map[string]*yaml.Node, key string) string {
	if n, ok := tf[key]; ok {
		return resolve(n).Value
	}
	return ""
}

// Computed reports whether the resource's template computes its kind
// (Kinds lists those it may render; KindRef is zero).
func (res *Resource) Computed() bool { return res.Kind == "" && len(res.Kinds) > 0 }

// MayRender reports whether gvk is among the kinds the resource may
// render.
func (res *Resource) MayRender(gvk schema.GroupVersionKind) bool {
	return slices.ContainsFunc(res.Kinds, func(k KindRef) bool { return k.GVK == gvk })
}

// KindNames names the resource's kinds, for messages: "v1 ConfigMap, v1
// Secret".
func (res *Resource) KindNames() string {
	names := make([]string, len(res.Kinds))
	for i, k := range res.Kinds {
		names[i] = k.APIVersion + " " + k.Kind
	}
	return strings.Join(names, ", ")
}

// ChildKinds are the kinds the rule's own resources (not its patches)
// may make, in spec order, each once.
func (r *Rule) ChildKinds() []KindRef {
	var out []KindRef
	for _, res := range r.Resources {
		if res.Mode != ModeOwn {
			continue
		}
		for _, k := range res.Kinds {
			if !slices.ContainsFunc(out, func(o KindRef) bool { return o.GVK == k.GVK }) {
				out = append(out, k)
			}
		}
	}
	return out
}
