package dynamic

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// Writer performs syncloop's writes: server-side apply of objects and of
// status, and deletes with a UID precondition. With DryRun set every request
// is a server-side dry run (dryRun=All): the server defaults, validates and
// admits, and persists nothing.
type Writer struct {
	Client dynamic.Interface
	DryRun bool
}

func (w *Writer) resource(m *meta.RESTMapping, namespace string) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return w.Client.Resource(m.Resource).Namespace(namespace)
	}
	return w.Client.Resource(m.Resource)
}

func (w *Writer) dryRun() []string {
	if w.DryRun {
		return []string{metav1.DryRunAll}
	}
	return nil
}

// Apply server-side applies obj as fieldManager and returns the object as
// the server has it afterwards.
func (w *Writer) Apply(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (*unstructured.Unstructured, error) {
	return w.resource(m, obj.GetNamespace()).Apply(ctx, obj.GetName(), obj,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: force, DryRun: w.dryRun()})
}

// ApplyStatus server-side applies obj's status through the status
// subresource.
func (w *Writer) ApplyStatus(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (*unstructured.Unstructured, error) {
	return w.resource(m, obj.GetNamespace()).ApplyStatus(ctx, obj.GetName(), obj,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: force, DryRun: w.dryRun()})
}

// Delete deletes namespace/name if — and only if — its UID is still uid,
// letting the garbage collector remove its dependents in the background.
func (w *Writer) Delete(ctx context.Context, m *meta.RESTMapping, namespace, name string, uid types.UID) error {
	background := metav1.DeletePropagationBackground
	return w.resource(m, namespace).Delete(ctx, name, metav1.DeleteOptions{
		Preconditions:     &metav1.Preconditions{UID: &uid},
		PropagationPolicy: &background,
		DryRun:            w.dryRun(),
	})
}
