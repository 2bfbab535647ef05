package dynamic

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// RemoveFinalizers removes from obj, as the caller last read it, the
// finalizers drop picks (FinalizersPatch), and reports whether it picked
// any.
func (w *Writer) RemoveFinalizers(ctx context.Context, m *meta.RESTMapping, obj metav1.Object, drop func(string) bool) (bool, error) {
	patch, ok, err := FinalizersPatch(obj, drop)
	if !ok || err != nil {
		return false, err
	}
	_, err = w.resource(m, obj.GetNamespace()).Patch(ctx, obj.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{DryRun: w.dryRun()})
	return true, err
}

// FinalizersPatch is the JSON patch that removes from obj, as last read,
// the finalizers drop picks; false when it picks none. The patch first
// tests obj's UID and each finalizer at its index: it never creates an
// object (a patch of one that is gone is NotFound), never removes another
// finalizer, and fails when the finalizers moved meanwhile — read the
// object again and retry. Server-side apply could only take off a
// finalizer its own field manager set.
func FinalizersPatch(obj metav1.Object, drop func(string) bool) ([]byte, bool, error) {
	ops := []map[string]any{{"op": "test", "path": "/metadata/uid", "value": string(obj.GetUID())}}
	finalizers := obj.GetFinalizers()
	// Backwards: removing one does not move those before it.
	for i := len(finalizers) - 1; i >= 0; i-- {
		if drop(finalizers[i]) {
			path := fmt.Sprintf("/metadata/finalizers/%d", i)
			ops = append(ops, map[string]any{"op": "test", "path": path, "value": finalizers[i]}, map[string]any{"op": "remove", "path": path})
		}
	}
	if len(ops) == 1 {
		return nil, false, nil
	}
	patch, err := json.Marshal(ops)
	return patch, err == nil, err
}
