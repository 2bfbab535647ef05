package rules

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// IsReservedKey reports whether a label or annotation key is syncloop's
// to set: its managed-by label and every key of its group (the ownership
// marks, the installation, adopt, the applied hash) or of created-once
// under it. A template may not write one literally (a load error), and
// the render drops those a template computes (a trigger's labels copied
// whole, say).
func IsReservedKey(key string) bool {
	return key == LabelManagedBy || strings.HasPrefix(key, Group+"/") || strings.HasPrefix(key, createdOncePrefix)
}

// ValidPathName checks that name can be an object's name in a request
// path, as client-go checks it before any request: not "." or "..", and
// no "/" or "%". The API server checks the rest of what the kind allows.
func ValidPathName(name string) error {
	if errs := content.IsPathSegmentName(name); len(errs) > 0 {
		return fmt.Errorf("%q cannot be an object's name: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// Label is obj's label key, read in place: an unstructured object's
// GetLabels copies its labels into a new map, and the engine reads one
// label of each child on every event, in its indexes, and on every
// reconcile.
func Label(obj metav1.Object, key string) string {
	return Labels(obj).Get(key)
}

// Annotation is obj's annotation key, read in place (see Label).
func Annotation(obj metav1.Object, key string) string {
	v, _ := LookupAnnotation(obj, key)
	return v
}

// LookupAnnotation is obj's annotation key and whether obj has it, read
// in place (see Label).
func LookupAnnotation(obj metav1.Object, key string) (string, bool) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		v, ok := metaMap(u, "annotations")[key].(string)
		return v, ok
	}
	v, ok := obj.GetAnnotations()[key]
	return v, ok
}

// Labels are obj's labels as a selector reads them, in place when obj is
// unstructured (see Label).
func Labels(obj metav1.Object) labels.Labels {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return labelMap(metaMap(u, "labels"))
	}
	return labels.Set(obj.GetLabels())
}

// metaMap is metadata.<field> of an unstructured object as it holds it, or
// nil.
func metaMap(u *unstructured.Unstructured, field string) map[string]any {
	md, _ := u.Object["metadata"].(map[string]any)
	m, _ := md[field].(map[string]any)
	return m
}

// labelMap is metadata.labels as the unstructured object holds it.
type labelMap map[string]any

func (m labelMap) Has(key string) bool {
	_, ok := m.Lookup(key)
	return ok
}

func (m labelMap) Get(key string) string {
	v, _ := m.Lookup(key)
	return v
}

func (m labelMap) Lookup(key string) (string, bool) {
	v, ok := m[key].(string)
	return v, ok
}

// NamespacedName is "<namespace>/<name>", or the name of a cluster-scoped
// object.
func (r ObjectRef) NamespacedName() string {
	if r.Namespace == "" {
		return r.Name
	}
	return r.Namespace + "/" + r.Name
}

// Trigger is a trigger object as a child names it: its reference (the
// syncloop.dev/owner annotation, ObjectRef.Owner) and its UID (the
// syncloop.dev/owner-uid label).
type Trigger struct {
	ObjectRef
	UID string
}

// TriggerOf describes obj.
func TriggerOf(obj *unstructured.Unstructured) Trigger {
	return Trigger{ObjectRef: RefOf(obj), UID: string(obj.GetUID())}
}

// Owner is the value of the syncloop.dev/owner annotation of the
// children of the object r refers to: "<apiVersion>/<kind>/<namespace>/<name>".
func (r ObjectRef) Owner() string {
	return r.APIVersion + "/" + r.Kind + "/" + r.Namespace + "/" + r.Name
}

// ParseOwner parses a syncloop.dev/owner annotation,
// "<apiVersion>/<kind>/<namespace>/<name>" (apiVersion may hold a slash).
func ParseOwner(s string) (ObjectRef, bool) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 4:
		return ObjectRef{APIVersion: parts[0], Kind: parts[1], Namespace: parts[2], Name: parts[3]}, true
	case 5:
		return ObjectRef{APIVersion: parts[0] + "/" + parts[1], Kind: parts[2], Namespace: parts[3], Name: parts[4]}, true
	}
	return ObjectRef{}, false
}
