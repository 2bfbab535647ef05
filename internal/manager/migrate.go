package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	sdynamic "github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// AnnotationMigration, on a CRD whose objects syncloop is moving to a new
// storage version, records how far it got: {"to": version, "after":
// "namespace/name" of the last object rewritten, "rewritten": count}. A
// migration cut short (a restart, a new leader) resumes after it.
const AnnotationMigration = rules.Group + "/storage-migration"

// DefaultMigrationQPS paces a migration's writes: a kind of 10,000
// objects moves in under two minutes, a small share of what the API
// server takes.
const DefaultMigrationQPS = 100

// migrationPage is how many objects one LIST of a migration reads.
const migrationPage = 100

// migrations move the objects of the kinds rules define to their storage
// version, as kube-storage-version-migrator does: a read and an update of
// each object (the API server then stores it in the storage version),
// paced, resumable, and, once every object is rewritten, the CRD's
// status.storedVersions trimmed to the storage version. Only a replica
// that runs the rules migrates, one migration per CRD at a time.
type migrations struct {
	// client reads and updates the objects: as the identity of the rule
	// that defines the kind, whose rights they are.
	client *sdynamic.Client
	crds   dynamic.ResourceInterface
	qps    float64
	// active says whether this replica still runs the rules: a migration
	// stops between pages when it no longer does.
	active func() bool
	// count counts objects (rewritten, gone, failed) and marks a
	// migration running; nil: not counted.
	count   func(crd, result string)
	running func(crd string, on bool)
	mu      sync.Mutex
	state   map[string]*migrationState // by CRD name
}

// migrationState is where one migration stands, for /readyz.
type migrationState struct {
	to        string
	rewritten int64
	done      bool
	err       error
}

// migrationProgress is AnnotationMigration's value.
type migrationProgress struct {
	To        string `json:"to"`
	After     string `json:"after,omitempty"`
	Rewritten int64  `json:"rewritten"`
}

// pending says whether crd (as served) has objects stored in a version
// other than its storage version, and which.
func pending(crd *unstructured.Unstructured) (storage string, old []string) {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		m, _ := v.(map[string]any)
		if s, _ := m["storage"].(bool); s {
			storage, _ = m["name"].(string)
		}
	}
	return storage, storedBesides(crd, storage)
}

// storedBesides are the versions of crd's status.storedVersions other
// than storage.
func storedBesides(crd *unstructured.Unstructured, storage string) []string {
	stored, _, _ := unstructured.NestedStringSlice(crd.Object, "status", "storedVersions")
	var old []string
	for _, v := range stored {
		if v != storage {
			old = append(old, v)
		}
	}
	return old
}

// progressOf is the progress crd records of a migration to storage; zero
// when it records none (or one to another version).
func progressOf(crd *unstructured.Unstructured, storage string) migrationProgress {
	var prog migrationProgress
	if err := json.Unmarshal([]byte(crd.GetAnnotations()[AnnotationMigration]), &prog); err != nil || prog.To != storage {
		return migrationProgress{To: storage}
	}
	return prog
}

// ensure starts migrating the objects of crd (as served after a keep) when
// some may be stored in an older version and no migration of it runs.
func (m *migrations) ensure(ctx context.Context, crd *unstructured.Unstructured, as rules.ServiceAccount) {
	storage, old := pending(crd)
	if len(old) == 0 || storage == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == nil {
		m.state = map[string]*migrationState{}
	}
	if st, ok := m.state[crd.GetName()]; ok && st.to == storage && !st.done && st.err == nil {
		return
	}
	st := &migrationState{to: storage}
	m.state[crd.GetName()] = st
	go func() {
		if m.running != nil {
			m.running(crd.GetName(), true)
			defer m.running(crd.GetName(), false)
		}
		err := m.migrate(ctx, crd, storage, old, st, as)
		m.mu.Lock()
		st.done, st.err = err == nil, err
		m.mu.Unlock()
		logger := klog.FromContext(ctx).WithValues("crd", crd.GetName(), "to", storage)
		switch {
		case err == nil:
			logger.Info("Storage migration done: every object is stored in the storage version", "rewritten", st.rewritten, "removedFromStoredVersions", old)
		case ctx.Err() == nil:
			logger.Error(err, "Storage migration stopped: tried again on the next keep")
		}
	}()
}

// migrate rewrites every object of crd not yet rewritten, then trims its
// storedVersions.
func (m *migrations) migrate(ctx context.Context, crd *unstructured.Unstructured, storage string, old []string, st *migrationState, as rules.ServiceAccount) error {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	c := m.client
	if !as.IsZero() {
		var err error
		if c, err = c.Impersonating(as.UserName()); err != nil {
			return err
		}
	}
	res := c.Dynamic.Resource(schema.GroupVersionResource{Group: group, Version: storage, Resource: plural})
	prog := progressOf(crd, storage)
	m.setRewritten(st, prog.Rewritten)
	klog.FromContext(ctx).Info("Storage migration: rewriting the objects stored in older versions", "crd", crd.GetName(), "to", storage, "from", old, "resumingAfter", prog.After)
	limiter := flowcontrol.NewTokenBucketRateLimiter(float32(m.qps), max(1, int(m.qps)))
	defer limiter.Stop()
	for cont := ""; ; {
		if m.active != nil && !m.active() {
			return fmt.Errorf("this replica no longer runs the rules")
		}
		list, err := res.List(ctx, metav1.ListOptions{Limit: migrationPage, Continue: cont})
		if apierrors.IsResourceExpired(err) {
			cont = "" // the continue token expired: from the start, skipping what is done
			continue
		}
		if err != nil {
			return err
		}
		for i := range list.Items {
			obj := &list.Items[i]
			if prog.After != "" && key(obj) <= prog.After {
				continue
			}
			if err := limiter.Wait(ctx); err != nil {
				return err
			}
			result, err := m.rewrite(ctx, res, obj)
			if m.count != nil {
				m.count(crd.GetName(), result)
			}
			if err != nil {
				return fmt.Errorf("rewriting %s: %w", key(obj), err)
			}
			prog.After, prog.Rewritten = key(obj), prog.Rewritten+1
			m.setRewritten(st, prog.Rewritten)
		}
		if err := m.record(ctx, crd.GetName(), &prog); err != nil {
			return err
		}
		if cont = list.GetContinue(); cont == "" {
			break
		}
	}
	return m.trim(ctx, crd.GetName(), storage)
}

func (m *migrations) setRewritten(st *migrationState, n int64) {
	m.mu.Lock()
	st.rewritten = n
	m.mu.Unlock()
}

// key orders objects as a list returns them (the order of their keys in
// etcd), which resuming after the last one rewritten relies on.
func key(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// rewrite updates obj as read: the API server stores it again, in the
// storage version (an object stored in it already is not written). On a
// conflict it reads the object again.
func (m *migrations) rewrite(ctx context.Context, res dynamic.NamespaceableResourceInterface, obj *unstructured.Unstructured) (string, error) {
	r := res.Namespace(obj.GetNamespace())
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		_, err := r.Update(ctx, obj, metav1.UpdateOptions{FieldManager: rules.FieldManagerCRD})
		if apierrors.IsConflict(err) {
			fresh, gerr := r.Get(ctx, obj.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			obj = fresh
		}
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return "gone", nil
	case err != nil:
		return "failed", err
	}
	return "rewritten", nil
}

// record writes the migration's progress on its CRD.
func (m *migrations) record(ctx context.Context, crd string, prog *migrationProgress) error {
	data, err := json.Marshal(prog)
	if err != nil {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationMigration: string(data)}}})
	_, err = m.crds.Patch(ctx, crd, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: rules.FieldManagerCRD})
	return err
}

// trim leaves only storage in the CRD's status.storedVersions, and drops
// the progress.
func (m *migrations) trim(ctx context.Context, crd, storage string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got, err := m.crds.Get(ctx, crd, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s, _ := pending(got); s != storage {
			return fmt.Errorf("the storage version changed to %s meanwhile", s)
		}
		if err := unstructured.SetNestedStringSlice(got.Object, []string{storage}, "status", "storedVersions"); err != nil {
			return err
		}
		_, err = m.crds.UpdateStatus(ctx, got, metav1.UpdateOptions{FieldManager: rules.FieldManagerCRD})
		return err
	})
	if err != nil {
		return fmt.Errorf("trimming status.storedVersions: %w", err)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + AnnotationMigration + `":null}}}`)
	_, err = m.crds.Patch(ctx, crd, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: rules.FieldManagerCRD})
	return err
}

// status are the lines of /readyz about migrations: one per CRD whose
// migration runs or failed. A migration never makes syncloop unready.
func (m *migrations) status() []string {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, crd := range slices.Sorted(maps.Keys(m.state)) {
		st := m.state[crd]
		switch {
		case st.err != nil:
			out = append(out, fmt.Sprintf("storage migration %s: to %s, stopped after %d objects: %v", crd, st.to, st.rewritten, st.err))
		case !st.done:
			out = append(out, fmt.Sprintf("storage migration %s: to %s, %d objects rewritten", crd, st.to, st.rewritten))
		}
	}
	return out
}

// Migration is where the storage migration of a kind a rule defines
// stands, as its CRD says: for syncloop rollout status.
type Migration struct {
	CRD  string `json:"crd"`
	Rule string `json:"rule"`
	// To is the storage version; Stored the versions objects may still be
	// stored in (status.storedVersions); Rewritten how many objects the
	// migration under way has rewritten.
	To        string   `json:"to"`
	Stored    []string `json:"storedVersions"`
	Rewritten int64    `json:"rewritten"`
}

// Migrations are the storage migrations pending or under way of the kinds
// installation's rules (or rule's alone) define: one LIST of syncloop's
// CRDs. A CRD stored in its storage version alone has none.
func Migrations(ctx context.Context, c *Clients, installation, rule string) ([]Migration, error) {
	list, err := c.Dynamic.Dynamic.Resource(crdResource).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelManagedBy + "=" + rules.ManagedByValue})
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, crd := range list.Items {
		l := crd.GetLabels()
		if l[rules.LabelInstallation] != installation || (rule != "" && l[rules.LabelRule] != rule) {
			continue
		}
		storage, old := pending(&crd)
		if len(old) == 0 {
			continue
		}
		stored, _, _ := unstructured.NestedStringSlice(crd.Object, "status", "storedVersions")
		m := Migration{CRD: crd.GetName(), Rule: l[rules.LabelRule], To: storage, Stored: stored}
		m.Rewritten = progressOf(&crd, storage).Rewritten
		out = append(out, m)
	}
	return out, nil
}
