package dynamic

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/apply"
)

// Writer performs syncloop's writes: server-side apply of objects and of
// status, and deletes with a UID precondition. With DryRun set every request
// is a server-side dry run (dryRun=All): the server defaults, validates and
// admits, and persists nothing.
type Writer struct {
	Client *Client
	DryRun bool
}

func (w *Writer) resource(m *meta.RESTMapping, namespace string) dynamic.ResourceInterface {
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return w.Client.Dynamic.Resource(m.Resource).Namespace(namespace)
	}
	return w.Client.Dynamic.Resource(m.Resource)
}

func (w *Writer) dryRun() []string {
	if w.DryRun {
		return []string{metav1.DryRunAll}
	}
	return nil
}

// Get reads one object from the API server (a consistent read), also in a
// dry run.
func (w *Writer) Get(ctx context.Context, m *meta.RESTMapping, namespace, name string) (*unstructured.Unstructured, error) {
	return w.resource(m, namespace).Get(ctx, name, metav1.GetOptions{})
}

// Apply server-side applies obj as fieldManager and returns the object as
// the server has it afterwards.
func (w *Writer) Apply(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (*unstructured.Unstructured, error) {
	return w.resource(m, obj.GetNamespace()).Apply(ctx, obj.GetName(), obj,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: force, DryRun: w.dryRun()})
}

// ApplyVersion server-side applies obj as Apply does, and returns only the
// resourceVersion the server answered with: the answer — the whole object,
// managedFields included — is not decoded, which a caller that needs only
// the version is spared.
func (w *Writer) ApplyVersion(ctx context.Context, m *meta.RESTMapping, obj *unstructured.Unstructured, fieldManager string, force bool) (string, error) {
	req, err := apply.NewRequest(w.Client.rest, obj.Object)
	if err != nil {
		return "", err
	}
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: force, DryRun: w.dryRun()}.ToPatchOptions()
	res := req.AbsPath(path(m, obj.GetNamespace(), obj.GetName())...).
		SpecificallyVersionedParams(&opts, parameterCodec, optionsVersion).
		Do(ctx)
	if err := res.Error(); err != nil { // the server's Status, as the dynamic client reports it
		return "", err
	}
	body, _ := res.Raw()
	var answer struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		return "", fmt.Errorf("decoding the answer to an apply: %w", err)
	}
	return answer.Metadata.ResourceVersion, nil
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
