package dynamic

import (
	"context"
	"encoding/json"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Revisions stores versions of something as apps/v1 ControllerRevisions
// in one namespace, selected by labels: the objects `kubectl get
// controllerrevisions` lists, each holding its data and a revision number
// that orders them. It knows nothing of what the data is.
type Revisions struct {
	client    kubernetes.Interface
	namespace string
}

// NewRevisions stores revisions in namespace.
func NewRevisions(c kubernetes.Interface, namespace string) *Revisions {
	return &Revisions{client: c, namespace: namespace}
}

// Namespace is where the revisions are.
func (s *Revisions) Namespace() string { return s.namespace }

// List returns the revisions the label selector selects, oldest (lowest
// revision number) first.
func (s *Revisions) List(ctx context.Context, selector string) ([]appsv1.ControllerRevision, error) {
	list, err := s.client.AppsV1().ControllerRevisions(s.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Revision < list.Items[j].Revision })
	return list.Items, nil
}

// Create stores a new revision: name, labels, annotations, data (JSON)
// and its number.
func (s *Revisions) Create(ctx context.Context, name string, labels, annotations map[string]string, data []byte, revision int64) error {
	cr := &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace, Labels: labels, Annotations: annotations},
		Data:       runtime.RawExtension{Raw: data},
		Revision:   revision,
	}
	_, err := s.client.AppsV1().ControllerRevisions(s.namespace).Create(ctx, cr, metav1.CreateOptions{})
	return err
}

// Renumber makes an existing revision the newest: its number becomes
// revision, as a Deployment's rollback renumbers the ReplicaSet it returns
// to. The update fails if the object changed since it was read.
func (s *Revisions) Renumber(ctx context.Context, cr appsv1.ControllerRevision, revision int64) error {
	cr.Revision = revision
	_, err := s.client.AppsV1().ControllerRevisions(s.namespace).Update(ctx, &cr, metav1.UpdateOptions{})
	return err
}

// Delete deletes a revision, if it is still the object read (its UID).
func (s *Revisions) Delete(ctx context.Context, cr appsv1.ControllerRevision) error {
	uid := cr.UID
	return s.client.AppsV1().ControllerRevisions(s.namespace).Delete(ctx, cr.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

// Annotate sets one annotation of a revision (a merge patch) and returns
// the revision as it then is.
func (s *Revisions) Annotate(ctx context.Context, name, key, value string) (*appsv1.ControllerRevision, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: value}}})
	if err != nil {
		return nil, err
	}
	return s.client.AppsV1().ControllerRevisions(s.namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
}

// Get reads one revision.
func (s *Revisions) Get(ctx context.Context, name string) (*appsv1.ControllerRevision, error) {
	return s.client.AppsV1().ControllerRevisions(s.namespace).Get(ctx, name, metav1.GetOptions{})
}

var revisionsGVR = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "controllerrevisions"}

// Watch watches the revisions selector selects — their metadata only,
// through client — and calls onChange when one is made, changed (a
// renumbering, an annotation) or deleted, those of the initial list
// included. It runs until ctx ends; a watch refused (RBAC) is logged once
// and stopped.
func (s *Revisions) Watch(ctx context.Context, client metadata.Interface, selector string, onChange func()) {
	inf := metadatainformer.NewFilteredMetadataInformer(client, revisionsGVR, s.namespace, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = selector }).Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { onChange() },
		UpdateFunc: func(any, any) { onChange() },
		DeleteFunc: func(any) { onChange() },
	}); err != nil { // the informer has not started: never
		klog.FromContext(ctx).Error(err, "Cannot watch the rules' revisions")
		return
	}
	runUnlessForbidden(ctx, inf, "Not allowed to watch the rules' revisions: a broken rule file does not follow a version another replica records later")
}
