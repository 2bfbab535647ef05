package schema

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// IsCRD reports whether an object (as decoded from YAML) is a
// CustomResourceDefinition.
func IsCRD(obj map[string]any) bool {
	return obj["apiVersion"] == "apiextensions.k8s.io/v1" && obj["kind"] == "CustomResourceDefinition"
}

// FromCRDs returns the kinds the CustomResourceDefinitions among objs
// define, each version with a schema, falling back on next for others. A
// custom kind's root gets apiVersion, kind and the ObjectMeta of metadata,
// as the API server serves it. A version whose schema does not decode is
// left out.
func FromCRDs(objs []map[string]any, next Source) *Kinds {
	k := &Kinds{schemas: map[schema.GroupVersionKind]*spec.Schema{}, versions: map[schema.GroupVersionKind]string{}, next: next}
	meta := Builtin().Schema(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}).Properties["metadata"]
	for _, obj := range objs {
		if !IsCRD(obj) {
			continue
		}
		spec_, _ := obj["spec"].(map[string]any)
		group, _ := spec_["group"].(string)
		names, _ := spec_["names"].(map[string]any)
		kind, _ := names["kind"].(string)
		versions, _ := spec_["versions"].([]any)
		for _, v := range versions {
			vm, _ := v.(map[string]any)
			name, _ := vm["name"].(string)
			sch, _ := vm["schema"].(map[string]any)
			raw, ok := sch["openAPIV3Schema"]
			if !ok || name == "" || kind == "" {
				continue
			}
			// A schema that does not decode is the API server's to
			// reject: its kind is not checked here.
			data, err := json.Marshal(raw)
			if err != nil {
				continue
			}
			s := &spec.Schema{}
			if err := json.Unmarshal(data, s); err != nil {
				continue
			}
			if s.Properties == nil {
				s.Properties = map[string]spec.Schema{}
			}
			s.Properties["apiVersion"] = *spec.StringProperty()
			s.Properties["kind"] = *spec.StringProperty()
			s.Properties["metadata"] = meta
			gvk := schema.GroupVersionKind{Group: group, Version: name, Kind: kind}
			k.schemas[gvk] = s
			sum := sha256.Sum256(data)
			k.versions[gvk] = hex.EncodeToString(sum[:8])
		}
	}
	return k
}
