package manager

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/rules"
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// The results of an apply of a CRD (syncloop_crd_apply_total's result).
const (
	crdCreated = "created"
	crdUpdated = "updated"
	crdFailed  = "failed"
)

// crdReadTimeout bounds a rule load's read of a CRD.
const crdReadTimeout = 30 * time.Second

// crdWait bounds how long one keep waits, for all its CRDs together, for
// the API server to establish them (it takes well under a second): the
// rule set waits that long at most — a rule whose CRD takes longer waits
// for its kind in the engine, as any rule whose kind is not served, and
// the others are not held up.
const crdWait = 10 * time.Second

// crdKeeper keeps the CustomResourceDefinitions of the kinds rules define
// (spec.api) as the rules generate them: before a set is put in force it
// server-side applies each CRD that differs from the one served, with its
// own field manager, and waits until it is established. It never deletes
// one: that would delete every object of the kind. The loader has checked
// the changes before (rules.Loader.UseServedCRDs): a rule whose change is
// breaking, or whose CRD is not syncloop's, never gets here.
type crdKeeper struct {
	crds dynamic.ResourceInterface
	// manage is false with --manage-crds=false: CRDs come from elsewhere
	// and are only checked.
	manage bool
	// dryRun, when set, gets what keep would do instead (run --dry-run).
	dryRun engine.Planner
	mu     sync.Mutex // one keep at a time
	// failures are the CRDs the last keep could not keep, and why, for
	// /readyz: "crd <name> (rule <rule>): <error>".
	failures atomic.Pointer[[]string]
	// applied counts applies (syncloop_crd_apply_total); nil: not counted.
	applied func(rule, result string)
	// panicked counts the panics a keep contains; nil: not counted.
	panicked func(rule, where string)
	// caBundle is what the CRDs of kinds that convert trust to reach
	// syncloop's webhook; nil when the webhook is not served here.
	caBundle func() []byte
	// migrations move the objects of a kind whose storage version
	// changed; nil: none (plan).
	migrations *migrations
	// injectCA, when set, is the cert-manager Certificate whose CA the
	// CRDs of kinds that convert trust (AnnotationInjectCA), instead of
	// caBundle.
	injectCA string
}

// failed are the CRDs the last keep could not keep, and why.
func (k *crdKeeper) failed() []string {
	if f := k.failures.Load(); f != nil {
		return *f
	}
	return nil
}

func newCRDKeeper(c *Clients, manage bool) *crdKeeper {
	return &crdKeeper{crds: c.Dynamic.Dynamic.Resource(crdResource), manage: manage}
}

// CRD implements rules.CRDSource: one GET, when a rule that defines a kind
// loads (at start and when its file changes) — rare enough that a cache
// of every CRD in the cluster, large in clusters of many operators,
// would cost more than it saves.
func (k *crdKeeper) CRD(name string) (*unstructured.Unstructured, error) {
	ctx, cancel := context.WithTimeout(context.Background(), crdReadTimeout)
	defer cancel()
	got, err := k.crds.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case apierrors.IsForbidden(err) && !k.manage:
		// Only checked: without the right to read it, it is not.
		return nil, nil
	case err != nil:
		return nil, err
	}
	return got, nil
}

// keep applies the CRDs of set's rules that differ from those served and
// waits until each is established. A rule whose CRD cannot be applied is
// logged; it waits for its kind to be served like any rule whose kind is
// not (and /readyz says so). It reports whether a CRD failed, for a retry.
func (k *crdKeeper) keep(ctx context.Context, set *rules.Set) (failed bool) {
	if !k.manage {
		return false
	}
	if k.dryRun != nil {
		k.plan(set, k.dryRun)
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	logger := klog.FromContext(ctx)
	var failures []string
	defer func() { k.failures.Store(&failures) }()
	count := func(rule, result string) {
		if k.applied != nil {
			k.applied(rule, result)
		}
	}
	fail := func(r *rules.Rule, what string, err error) {
		count(r.Name, crdFailed)
		logger.Error(err, what, "rule", r.Name, "crd", r.API.CRDName())
		failures = append(failures, fmt.Sprintf("crd %s (rule %s): %s: %v", r.API.CRDName(), r.Name, strings.ToLower(what[:1])+what[1:], err))
		failed = true
	}
	deadline := time.Now().Add(crdWait)
	for _, r := range set.Rules() {
		if r.API == nil {
			continue
		}
		what := "Keeping the CustomResourceDefinition"
		err := containRule(logger, k.panicked, r.Name, panicCRDs, func() error {
			var err error
			what, err = k.keepOne(ctx, r, deadline, count)
			return err
		})
		if err != nil {
			fail(r, what, err)
		}
	}
	return failed
}

// keepOne keeps the CRD of the kind r defines; what says what failed.
func (k *crdKeeper) keepOne(ctx context.Context, r *rules.Rule, deadline time.Time, count func(rule, result string)) (what string, err error) {
	want, err := k.want(ctx, r, deadline)
	if err != nil {
		return "Waiting for the conversion webhook's certificate", err
	}
	served, err := k.CRD(want.GetName())
	if err != nil {
		return "Reading the CustomResourceDefinition", err
	}
	if served != nil && !r.OwnsCRD(served) {
		return "", nil // the loader refused such a rule; an older version of it may still run
	}
	current := served
	if needsApply(served, want) {
		if current, err = k.apply(ctx, want); err != nil {
			return "Applying the CustomResourceDefinition", err
		}
		klog.FromContext(ctx).Info("CustomResourceDefinition applied", "rule", r.Name, "crd", want.GetName(), "created", served == nil)
		count(r.Name, map[bool]string{true: crdCreated, false: crdUpdated}[served == nil])
	}
	if err := k.established(ctx, current, time.Until(deadline)); err != nil {
		return "Waiting for the CustomResourceDefinition to be established", err
	}
	if k.migrations != nil {
		k.migrations.ensure(ctx, current, r.Identity)
	}
	return "", nil
}

// want is the CRD of the kind r defines as it is to be served: with the
// CA bundle of syncloop's conversion webhook when its kind converts —
// waited for until deadline when the first rule that converts has just
// started the webhook's certificate keeper.
func (k *crdKeeper) want(ctx context.Context, r *rules.Rule, deadline time.Time) (*unstructured.Unstructured, error) {
	crd := r.CRD()
	if r.API.Converts() && k.injectCA != "" {
		a := crd.GetAnnotations()
		a[AnnotationInjectCA] = k.injectCA
		crd.SetAnnotations(a)
		return crd, nil
	}
	if !r.API.Converts() || k.caBundle == nil {
		return crd, nil
	}
	var bundle []byte
	_ = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, max(time.Until(deadline), 50*time.Millisecond), true, func(context.Context) (bool, error) {
		bundle = k.caBundle()
		return len(bundle) > 0, nil
	})
	if len(bundle) == 0 {
		return nil, errors.New("the conversion webhook has no certificate yet (its Secret is being made)")
	}
	err := unstructured.SetNestedField(crd.Object, base64.StdEncoding.EncodeToString(bundle), "spec", "conversion", "webhook", "clientConfig", "caBundle")
	return crd, err
}

// needsApply reports whether the served CRD (nil: none) is not yet want:
// it differs in what the rule decides, or lacks syncloop's labels.
func needsApply(served, want *unstructured.Unstructured) bool {
	if served == nil || len(rules.CRDDiff(served, want)) > 0 {
		return true
	}
	for k, v := range want.GetLabels() {
		if served.GetLabels()[k] != v {
			return true
		}
	}
	// The conversion a CRD keeps for when no rule defines its kind, and
	// whose CA it trusts.
	for k, v := range want.GetAnnotations() {
		if served.GetAnnotations()[k] != v {
			return true
		}
	}
	return false
}

// apply server-side applies crd with syncloop's CRD field manager, taking
// over the fields another manager set (an adopted CRD's), and returns the
// CRD as the API server then has it.
func (k *crdKeeper) apply(ctx context.Context, crd *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(crd.Object)
	if err != nil {
		return nil, err
	}
	force := true
	return k.crds.Patch(ctx, crd.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: rules.FieldManagerCRD, Force: &force})
}

// established waits until the API server has accepted the names of crd
// (as last read or applied) and established it: its kind is then served.
// One already established is not read again.
func (k *crdKeeper) established(ctx context.Context, crd *unstructured.Unstructured, timeout time.Duration) error {
	if ok, err := crdEstablished(crd); ok || err != nil {
		return err
	}
	var last string
	var refused error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, max(timeout, 100*time.Millisecond), false, func(ctx context.Context) (bool, error) {
		got, err := k.crds.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ok, err := crdEstablished(got)
		refused = err
		return ok, err
	})
	switch {
	case refused != nil:
		return refused
	case err != nil && last != "":
		return fmt.Errorf("%w (%s)", err, last)
	}
	return err
}

// crdEstablished reads a CRD's conditions: whether its names are accepted
// and it is established, or an error when its names are refused (another
// CRD holds one: waiting does not help).
func crdEstablished(crd *unstructured.Unstructured) (bool, error) {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	status := map[string]string{}
	for _, c := range conds {
		m, _ := c.(map[string]any)
		t, _ := m["type"].(string)
		s, _ := m["status"].(string)
		status[t] = s
		if t == "NamesAccepted" && s == "False" {
			msg, _ := m["message"].(string)
			return false, fmt.Errorf("its names are not accepted: %s", msg)
		}
	}
	return status["Established"] == "True" && status["NamesAccepted"] == "True", nil
}

// plan adds to p what keep would do to the CRDs of set's rules: a create,
// or an update with the diff of what changes. It returns the rules whose
// CRD it would create.
func (k *crdKeeper) plan(set *rules.Set, p engine.Planner) (created map[string]bool) {
	created = map[string]bool{}
	if !k.manage {
		return created
	}
	for _, r := range set.Rules() {
		if r.API == nil {
			continue
		}
		want := r.CRD()
		ref := rules.ObjectRef{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition", Name: want.GetName()}
		served, err := k.CRD(want.GetName())
		switch {
		case err != nil:
			p.Failed(r.Name, ref.String(), err)
		case served == nil:
			p.Plan(engine.Action{Action: engine.ActionCreate, Rule: r.Name, Object: ref})
			created[r.Name] = true
		case r.OwnsCRD(served) && needsApply(served, want):
			p.Plan(engine.Action{Action: engine.ActionUpdate, Rule: r.Name, Object: ref,
				Diff: engine.Diff("CustomResourceDefinition.apiextensions.k8s.io", served.Object, want.Object)})
		}
		if served != nil && r.OwnsCRD(served) {
			planMigration(p, r, ref, served)
		}
	}
	return created
}

// planMigration adds to p the storage migration keeping r's CRD would
// start: objects stored in a version other than the storage version the
// rule says.
func planMigration(p engine.Planner, r *rules.Rule, ref rules.ObjectRef, served *unstructured.Unstructured) {
	storage := r.API.StorageVersion().Name
	old := storedBesides(served, storage)
	if len(old) == 0 {
		return
	}
	p.Plan(engine.Action{Action: engine.ActionMigrate, Rule: r.Name, Object: ref,
		Reason: fmt.Sprintf("objects stored in %s are rewritten in %s, the storage version, then status.storedVersions is trimmed to it", strings.Join(old, ", "), storage)})
}
