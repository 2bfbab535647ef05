package rules

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/syncloop/syncloop/rules/expr"
)

// ForTenant is a copy of l whose loads are the tenant rules of namespace
// ns (a team's rules, from a ConfigMap there, or --tenant ns offline): each
// is confined to ns. A tenant rule
//
//   - is named <ns>.<name> (Rule.Name; Rule.Tenant is ns), so two
//     namespaces' rules never share a name — nor a platform rule's, which
//     has no dot;
//   - acts as a ServiceAccount of ns: spec.serviceAccountName, default
//     "default"; spec.serviceAccountNamespace, if given, must be ns;
//   - watches in ns (spec.watch.namespace defaults to it), and every
//     lookup, child and patched object is in ns: a cluster-scoped kind, a
//     literal other namespace or spec.api (a CRD is cluster-wide) is a load
//     error; a templated namespace is checked per trigger.
func (l *Loader) ForTenant(ns string) (*Loader, error) {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return nil, fmt.Errorf("tenant namespace %q: %s", ns, strings.Join(errs, "; "))
	}
	c := *l
	c.tenant = ns
	c.identities = identities{home: ns, def: ServiceAccount{Namespace: ns, Name: DefaultTenantServiceAccount}}
	return &c, nil
}

// DefaultTenantServiceAccount is the ServiceAccount of its namespace a
// tenant rule acts as when it names none.
const DefaultTenantServiceAccount = "default"

// TenantName is the name of the tenant rule name of namespace ns.
func TenantName(ns, name string) string { return ns + "." + name }

// maxNameLength bounds a rule's name: it is a label value on children.
const maxNameLength = validation.LabelValueMaxLength

// tenantName names r for its namespace, when it is a tenant rule.
func (d *decoder) tenantName(r *Rule, at Pos) {
	if d.tenant == "" || r.Name == "" {
		return
	}
	r.Tenant = d.tenant
	r.Name = TenantName(d.tenant, r.Name)
	if len(r.Name) > maxNameLength {
		d.errorAt(at, "metadata.name", "a tenant rule is named <namespace>.<name>, which must be at most %d characters: %q has %d", maxNameLength, r.Name, len(r.Name))
	}
}

// checkTenant reports what of r, a tenant rule, would leave its namespace
// where the rule says so literally (where its namespace is templated, the
// engine checks each trigger), and defaults its watch to the namespace.
func (d *decoder) checkTenant(r *Rule, docVal any) {
	ns := d.tenant
	if ns == "" {
		return
	}
	at := func(p expr.Path, def Pos) Pos {
		if pos, ok := d.at[posKey(p, false)]; ok {
			return pos
		}
		return def
	}
	confined := fmt.Sprintf("a tenant rule of namespace %q stays in it", ns)
	if r.API != nil {
		d.errorAt(at(expr.Path{"spec", "api"}, r.Pos), "spec.api", "%s: it cannot define a kind (a CustomResourceDefinition is cluster-wide)", confined)
	}
	cluster := func(ref KindRef) bool {
		if d.scopes == nil {
			return false
		}
		namespaced, known := d.scopes.Scope(ref.GVK)
		return known && !namespaced
	}
	switch {
	case r.Watch.Kind != "" && cluster(r.Watch.KindRef):
		d.errorAt(at(expr.Path{"spec", "watch", "kind"}, r.Pos), "spec.watch.kind", "%s: it cannot watch %s, which is cluster-scoped", confined, r.Watch.Kind)
	case r.Watch.Namespace == "":
		r.Watch.Namespace = ns
	case r.Watch.Namespace != ns:
		d.errorAt(at(expr.Path{"spec", "watch", "namespace"}, r.Pos), "spec.watch.namespace", "%s: it cannot watch namespace %q", confined, r.Watch.Namespace)
	}
	for _, res := range r.Resources {
		p := expr.Path{"spec", "resources", res.Index, "template", "metadata", "namespace"}
		clusterKind := slices.IndexFunc(res.Kinds, cluster)
		switch {
		case clusterKind >= 0:
			d.errorAt(at(expr.Path{"spec", "resources", res.Index, "template", "kind"}, res.Pos), PathField("", expr.Path{"spec", "resources", res.Index, "template", "kind"}),
				"%s: it cannot make or patch %s, which is cluster-scoped", confined, res.Kinds[clusterKind].Kind)
		case res.LiteralNamespace != "" && res.LiteralNamespace != ns:
			d.errorAt(at(p, res.Pos), PathField("", p), "%s: it cannot make or patch objects in namespace %q", confined, res.LiteralNamespace)
		}
	}
	for _, l := range r.Lookups {
		switch {
		case cluster(l.KindRef):
			d.errorAt(l.Pos, l.Field+".kind", "%s: it cannot read %s, which is cluster-scoped", confined, l.Kind)
		case l.Namespace.IsLiteral() && l.Namespace.Literal != "" && l.Namespace.Literal != ns:
			d.errorAt(at(expr.Path{"spec", "lookups", l.Index, "namespace"}, l.Pos), l.Field+".namespace", "%s: it cannot read namespace %q", confined, l.Namespace.Literal)
		}
	}
	if r.Identity.Namespace != ns {
		d.errorAt(at(expr.Path{"spec", "serviceAccountNamespace"}, r.Pos), "spec.serviceAccountNamespace", "%s: it acts as a ServiceAccount of its namespace, not of %q", confined, r.Identity.Namespace)
	}
}
