package dynamic

import (
	"encoding/base64"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The kinds most rules make — ConfigMaps and Secrets — are turned into
// unstructured content field by field rather than by the reflective
// runtime.DefaultUnstructuredConverter: every watch event of such a child
// passes here. The result is the converter's, value for value (types
// included), which TestFastUnstructured checks on generated objects; any
// other kind, and an object with managedFields kept, goes the converter's
// way.

// fastUnstructured is obj's unstructured content without its apiVersion
// and kind, and true, when obj is a kind converted here.
func fastUnstructured(obj runtime.Object) (map[string]any, bool) {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		if len(o.ManagedFields) > 0 {
			return nil, false
		}
		out := withMeta(&o.ObjectMeta, o.Immutable)
		if len(o.Data) > 0 {
			out["data"] = stringsContent(o.Data)
		}
		if len(o.BinaryData) > 0 {
			out["binaryData"] = bytesContent(o.BinaryData)
		}
		return out, true
	case *corev1.Secret:
		if len(o.ManagedFields) > 0 {
			return nil, false
		}
		out := withMeta(&o.ObjectMeta, o.Immutable)
		if len(o.Data) > 0 {
			out["data"] = bytesContent(o.Data)
		}
		if len(o.StringData) > 0 {
			out["stringData"] = stringsContent(o.StringData)
		}
		if o.Type != "" {
			out["type"] = string(o.Type)
		}
		return out, true
	}
	return nil, false
}

// withMeta is the content of an object with metadata m and an immutable
// field.
func withMeta(m *metav1.ObjectMeta, immutable *bool) map[string]any {
	out := make(map[string]any, 5)
	out["metadata"] = objectMetaContent(m)
	if immutable != nil {
		out["immutable"] = *immutable
	}
	return out
}

// bytesContent is a map of bytes as JSON has it: each value base64.
func bytesContent(m map[string][]byte) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if v == nil {
			out[k] = nil
			continue
		}
		out[k] = base64.StdEncoding.EncodeToString(v)
	}
	return out
}

// objectMetaContent is m's unstructured content, managedFields aside (the
// callers have none).
func objectMetaContent(m *metav1.ObjectMeta) map[string]any {
	out := make(map[string]any, 8)
	str := func(k, v string) {
		if v != "" {
			out[k] = v
		}
	}
	str("name", m.Name)
	str("generateName", m.GenerateName)
	str("namespace", m.Namespace)
	//lint:ignore SA1019 an object that still carries one keeps it, as the API server sent it
	str("selfLink", m.SelfLink)
	str("uid", string(m.UID))
	str("resourceVersion", m.ResourceVersion)
	if m.Generation != 0 {
		out["generation"] = m.Generation
	}
	if t := m.CreationTimestamp.ToUnstructured(); t != nil { // a zero time is left out
		out["creationTimestamp"] = t
	}
	if m.DeletionTimestamp != nil { // a zero time is kept, as null
		out["deletionTimestamp"] = m.DeletionTimestamp.ToUnstructured()
	}
	if m.DeletionGracePeriodSeconds != nil {
		out["deletionGracePeriodSeconds"] = *m.DeletionGracePeriodSeconds
	}
	if len(m.Labels) > 0 {
		out["labels"] = stringsContent(m.Labels)
	}
	if len(m.Annotations) > 0 {
		out["annotations"] = stringsContent(m.Annotations)
	}
	if len(m.OwnerReferences) > 0 {
		refs := make([]any, len(m.OwnerReferences))
		for i, r := range m.OwnerReferences {
			ref := make(map[string]any, 6)
			ref["apiVersion"] = r.APIVersion
			ref["kind"] = r.Kind
			ref["name"] = r.Name
			ref["uid"] = string(r.UID)
			if r.Controller != nil {
				ref["controller"] = *r.Controller
			}
			if r.BlockOwnerDeletion != nil {
				ref["blockOwnerDeletion"] = *r.BlockOwnerDeletion
			}
			refs[i] = ref
		}
		out["ownerReferences"] = refs
	}
	if len(m.Finalizers) > 0 {
		fin := make([]any, len(m.Finalizers))
		for i, f := range m.Finalizers {
			fin[i] = f
		}
		out["finalizers"] = fin
	}
	return out
}

func stringsContent(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
