package rules

import (
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
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
	s := &OfflineScope{known: map[schema.GroupKind]bool{}}
	for _, o := range objects {
		if o.GetKind() == "CustomResourceDefinition" && strings.HasPrefix(o.GetAPIVersion(), "apiextensions.k8s.io/") {
			group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
			kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
			scope, _, _ := unstructured.NestedString(o.Object, "spec", "scope")
			s.known[schema.GroupKind{Group: group, Kind: kind}] = scope == "Namespaced"
		}
	}
	for _, o := range objects {
		gk := o.GroupVersionKind().GroupKind()
		if _, ok := s.known[gk]; !ok && o.GetNamespace() != "" {
			s.known[gk] = true
		}
	}
	return s
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
