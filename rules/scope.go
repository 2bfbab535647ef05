package rules

import (
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/syncloop/syncloop/rules/expr"
)

// clusterScopedBuiltins are the built-in kinds of Kubernetes v1.37 that are
// not namespaced. Every other kind client-go knows is namespaced. A test
// checks this table against a real API server's discovery.
var clusterScopedBuiltins = map[schema.GroupKind]bool{}

func init() {
	for group, kinds := range map[string]string{
		"":                             "Namespace Node PersistentVolume ComponentStatus",
		"rbac.authorization.k8s.io":    "ClusterRole ClusterRoleBinding",
		"apiextensions.k8s.io":         "CustomResourceDefinition",
		"apiregistration.k8s.io":       "APIService",
		"storage.k8s.io":               "StorageClass CSIDriver CSINode VolumeAttachment VolumeAttributesClass",
		"scheduling.k8s.io":            "PriorityClass",
		"node.k8s.io":                  "RuntimeClass",
		"networking.k8s.io":            "IngressClass IPAddress ServiceCIDR",
		"certificates.k8s.io":          "CertificateSigningRequest ClusterTrustBundle",
		"flowcontrol.apiserver.k8s.io": "FlowSchema PriorityLevelConfiguration",
		"admissionregistration.k8s.io": "ValidatingWebhookConfiguration MutatingWebhookConfiguration " +
			"ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding MutatingAdmissionPolicy MutatingAdmissionPolicyBinding",
		"resource.k8s.io":           "DeviceClass ResourceSlice DeviceTaintRule",
		"storagemigration.k8s.io":   "StorageVersionMigration",
		"internal.apiserver.k8s.io": "StorageVersion",
		"authentication.k8s.io":     "TokenReview SelfSubjectReview",
		"authorization.k8s.io":      "SubjectAccessReview SelfSubjectAccessReview SelfSubjectRulesReview",
	} {
		for _, k := range strings.Fields(kinds) {
			clusterScopedBuiltins[schema.GroupKind{Group: group, Kind: k}] = true
		}
	}
}

// builtinKinds is every kind client-go's scheme knows, by group.
var builtinKinds = sync.OnceValue(func() map[schema.GroupKind]bool {
	m := map[schema.GroupKind]bool{}
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if !strings.HasSuffix(gvk.Kind, "List") && !strings.HasSuffix(gvk.Kind, "Options") {
			m[gvk.GroupKind()] = true
		}
	}
	return m
})

// builtinNamespaced reports the scope of a built-in kind, and whether the
// kind is built in at all.
func builtinNamespaced(gk schema.GroupKind) (namespaced, known bool) {
	if clusterScopedBuiltins[gk] {
		return false, true
	}
	if builtinKinds()[gk] {
		return true, true
	}
	return false, false
}

// OfflineScope answers Scoper without a cluster: built-in kinds from what
// client-go knows, custom kinds from CustomResourceDefinitions among the
// objects, and otherwise from the objects themselves (a kind with an object
// in a namespace is namespaced).
type OfflineScope struct {
	known map[schema.GroupKind]bool
}

// NewOfflineScope learns from objects.
func NewOfflineScope(objects []*unstructured.Unstructured) *OfflineScope {
	s := &OfflineScope{known: crdScopes(objects)}
	for _, o := range objects {
		gk := o.GroupVersionKind().GroupKind()
		if _, ok := s.known[gk]; !ok && o.GetNamespace() != "" {
			s.known[gk] = true
		}
	}
	return s
}

// crdScopes are the scopes of the kinds the CustomResourceDefinitions among
// objects define: true for Namespaced.
func crdScopes(objects []*unstructured.Unstructured) map[schema.GroupKind]bool {
	known := map[schema.GroupKind]bool{}
	for _, o := range objects {
		if o.GetKind() == "CustomResourceDefinition" && strings.HasPrefix(o.GetAPIVersion(), "apiextensions.k8s.io/") {
			group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
			scope, _, _ := unstructured.NestedString(o.Object, "spec", "scope")
			known[schema.GroupKind{Group: group, Kind: kind}] = scope == "Namespaced"
		}
	}
	return known
}

// ScopeSource says whether kinds are namespaced, as far as it knows, for
// the checks of a load: a namespaced child without a namespace under a
// cluster-scoped trigger, a namespace given to a cluster-scoped kind. `run`
// and `plan` answer from the cluster's discovery; offline, the built-in
// kinds and the CustomResourceDefinitions given are known.
type ScopeSource interface {
	Scope(gvk schema.GroupVersionKind) (namespaced, known bool)
}

// builtinScopes knows the built-in kinds.
type builtinScopes struct{}

func (builtinScopes) Scope(gvk schema.GroupVersionKind) (bool, bool) {
	return builtinNamespaced(gvk.GroupKind())
}

// scopeTable knows kinds from a table (CustomResourceDefinitions), and the
// rest from next.
type scopeTable struct {
	kinds map[schema.GroupKind]bool
	next  ScopeSource
}

func (t scopeTable) Scope(gvk schema.GroupVersionKind) (bool, bool) {
	if ns, ok := t.kinds[gvk.GroupKind()]; ok {
		return ns, true
	}
	return t.next.Scope(gvk)
}

// Namespaced implements Scoper.
func (s *OfflineScope) Namespaced(gvk schema.GroupVersionKind) (bool, error) {
	gk := gvk.GroupKind()
	if ns, ok := builtinNamespaced(gk); ok {
		return ns, nil
	}
	if ns, ok := s.known[gk]; ok {
		return ns, nil
	}
	return false, fmt.Errorf("scope of %s unknown offline: add its CustomResourceDefinition to --objects", gk)
}

// checkScopes reports, at load, what only fails when a trigger renders
// otherwise: a namespace given to a cluster-scoped kind (the watch, a
// child, a lookup), and a namespaced child or lookup by name without one
// under a cluster-scoped trigger. Kinds whose scope is not known (a CRD
// not installed, offline without its definition) are not checked.
func (d *decoder) checkScopes(r *Rule, docVal any) {
	if d.scopes == nil || r.Watch.Kind == "" {
		return
	}
	at := func(p expr.Path, def Pos) Pos {
		if pos, ok := d.at[posKey(p, false)]; ok {
			return pos
		}
		return def
	}
	triggerNS, triggerKnown := d.scopes.Scope(r.Watch.GVK)
	clusterTrigger := triggerKnown && !triggerNS
	if clusterTrigger && r.Watch.Namespace != "" {
		d.errorAt(at(expr.Path{"spec", "watch", "namespace"}, r.Pos), "spec.watch.namespace", "%s is cluster-scoped: leave namespace out", r.Watch.Kind)
	}
	for _, res := range r.Resources {
		md := expr.Path{"spec", "resources", res.Index, "template", "metadata"}
		ns, _ := lookup(docVal, append(md, "namespace")).(string)
		field := PathField("", append(md, "namespace"))
		var byScope [2][]string // the kinds, cluster-scoped and namespaced
		for _, k := range res.Kinds {
			namespaced, known := d.scopes.Scope(k.GVK)
			switch {
			case !known:
				continue
			case res.Function != nil: // what it returns is placed when it does
			case !namespaced && ns != "":
				d.errorAt(at(append(md, "namespace"), res.Pos), field, "%s is cluster-scoped: leave metadata.namespace out", k.Kind)
			case namespaced && ns == "" && clusterTrigger:
				d.errorAt(at(md, res.Pos), field, "%s is namespaced and the trigger (%s) is cluster-scoped: set metadata.namespace", k.Kind, r.Watch.Kind)
			}
			if namespaced {
				byScope[1] = append(byScope[1], k.Kind)
			} else {
				byScope[0] = append(byScope[0], k.Kind)
			}
		}
		if len(byScope[0]) > 0 && len(byScope[1]) > 0 {
			d.errorAt(at(expr.Path{"spec", "resources", res.Index, "kinds"}, res.Pos), fmt.Sprintf("spec.resources[%d].kinds", res.Index),
				"the kinds of one resource are all namespaced or all cluster-scoped, not %s (namespaced) and %s (cluster-scoped)",
				strings.Join(byScope[1], ", "), strings.Join(byScope[0], ", "))
		}
	}
	for _, l := range r.Lookups {
		namespaced, known := d.scopes.Scope(l.GVK)
		p := expr.Path{"spec", "lookups", l.Index, "namespace"}
		switch {
		case !known:
		case !namespaced && !l.Namespace.Empty():
			d.errorAt(at(p, l.Pos), l.Field+".namespace", "%s is cluster-scoped: leave namespace out", l.Kind)
		case namespaced && l.Namespace.Empty() && !l.List() && clusterTrigger:
			d.errorAt(l.Pos, l.Field+".namespace", "%s is namespaced and the trigger (%s) is cluster-scoped: set namespace", l.Kind, r.Watch.Kind)
		}
	}
}

// checkReadsOwnWrites reports a resource whose object is, literally, the
// one a lookup by name reads: a rule never writes what it reads (a copy
// into its source's own place would overwrite the source, then delete
// it). Where either is templated the engine finds it per trigger.
func (d *decoder) checkReadsOwnWrites(r *Rule, docVal any) {
	// where says where a literal template's or lookup's object is: its
	// namespace, "" for the trigger's, and false when templated.
	where := func(v any, present bool) (string, bool) {
		s, _ := v.(string)
		switch {
		case !present:
			return "", true
		case strings.Contains(s, "${"):
			return "", false
		}
		return s, true
	}
	for _, res := range r.Resources {
		if res.Mode != ModeOwn || res.LiteralName == "" {
			continue
		}
		md, _ := lookup(docVal, expr.Path{"spec", "resources", res.Index, "template", "metadata"}).(map[string]any)
		nsv, hasNS := md["namespace"]
		resNS, ok := where(nsv, hasNS)
		if !ok {
			continue
		}
		for _, l := range r.Lookups {
			if l.List() || !l.Name.IsLiteral() || l.Name.Literal != res.LiteralName || l.GVK.GroupKind() != res.GVK.GroupKind() ||
				!l.Namespace.IsLiteral() || l.Namespace.Literal != resNS {
				continue
			}
			p := expr.Path{"spec", "resources", res.Index, "template", "metadata", "name"}
			pos, found := d.at[posKey(p, false)]
			if !found {
				pos = res.Pos
			}
			d.errorAt(pos, PathField("", p), "resource %q writes %s %s, the object lookup %q reads: a rule never writes what it reads",
				res.ID, res.Kind, strings.TrimPrefix(resNS+"/"+res.LiteralName, "/"), l.ID)
		}
	}
}
