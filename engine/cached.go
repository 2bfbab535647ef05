package engine

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/syncloop/syncloop/dynamic"
)

// object is an object as an informer caches it: unstructured, or typed —
// the dynamic layer caches ConfigMaps and Secrets as their typed objects,
// whose heap the collector marks in a third of the time (dynamic's
// cached.go). What reads only metadata reads it through this interface;
// what reads the whole object asks wholeOf.
type object interface {
	metav1.Object
	runtime.Object
}

// asObject is a cached object, or the object of a delete's tombstone; false
// for anything else.
func asObject(obj any) (object, bool) {
	o, ok := unwrap(obj).(object)
	return o, ok
}

// wholeOf is a cached object as unstructured: itself, or converted from
// the typed one into a new object (nil for what is neither). Like a cached
// object, it is not to be changed.
func wholeOf(obj any) *unstructured.Unstructured {
	u, _ := dynamic.ToUnstructured(obj)
	return u
}
