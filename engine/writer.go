package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// A writer makes the writes of one rule's reconciles and accounts for
// them, so that the reconcile has one path whether it runs or plans.
// liveWriter sends them, remembers its own (ownWrites: their echoes cost
// nothing), counts them and emits Events; planWriter sends each as a
// dry-run request (nothing is persisted) and records what it would change
// as an Action of the plan.
type writer interface {
	// apply server-side applies one object and returns it as it now is
	// (w.readsLive), otherwise what it applied.
	apply(ctx context.Context, w *write) (map[string]any, error)
	// delete deletes child, with its UID as the precondition; a child
	// gone or replaced meanwhile is not an error. propagation is how its
	// own dependents go (an ordered teardown waits for them).
	delete(ctx context.Context, m *meta.RESTMapping, trigger rules.ObjectRef, child object, ch *changes, propagation metav1.DeletionPropagation) error
	// status applies patch to trigger's status subresource.
	status(ctx context.Context, m *meta.RESTMapping, trigger, patch *unstructured.Unstructured, manager string) error
	// mark applies patch, syncloop's marks on a trigger (the memory of a
	// createOnce resource's children, the teardown finalizer), to the
	// trigger; a dry run, which made no child, writes none.
	mark(ctx context.Context, m *meta.RESTMapping, patch *unstructured.Unstructured, manager string) error
	// unfinalize takes the finalizer off trigger; a dry run, which tears
	// nothing down, leaves it.
	unfinalize(ctx context.Context, m *meta.RESTMapping, trigger *unstructured.Unstructured, finalizer string) error
	// tearingDown notes a wave of an ordered teardown begun: msg says
	// which and its children.
	tearingDown(trigger *unstructured.Unstructured, msg string)
	// held notes children of trigger left in a cluster they leave: the
	// rule's prune budget there does not allow their delete now.
	held(trigger *unstructured.Unstructured, h leaveHold)
	// wait notes a resource left unapplied until one it reads is ready.
	wait(trigger *unstructured.Unstructured, st *render.ResourceState)
	// unreachable notes a child left as it is in a cluster it cannot
	// reach now (ue says which and why).
	unreachable(trigger *unstructured.Unstructured, child render.Child, ue *render.UnreachableError)
	// conflict notes a child left unapplied: an object syncloop may not
	// take over holds its name.
	conflict(trigger *unstructured.Unstructured, ce *render.ConflictError)
	// failed notes that err failed trigger's reconcile.
	failed(trigger *unstructured.Unstructured, err error)
	// contended notes a child another writer keeps changing, left as it
	// is for a while.
	contended(trigger *unstructured.Unstructured, ce *render.ContendedError)
	// reconciled notes what one reconcile of trigger changed.
	reconciled(trigger *unstructured.Unstructured, ch *changes)
	// ended notes that a reconcile of key ended with err (nil: it
	// succeeded), and returns the error as the worker is to take it.
	ended(key cache.ObjectName, err error) error
	// dryRun reports whether nothing is persisted (render.Input.DryRun).
	dryRun() bool
}

// writeKind says what a write is.
type writeKind int

const (
	writeChild   writeKind = iota // a child syncloop owns
	writePatch                    // a patch onto an object syncloop does not own
	writeRelease                  // a patch's fields given up (an empty apply)
)

// write is one server-side apply a reconcile makes.
type write struct {
	kind      writeKind
	mapping   *meta.RESTMapping
	obj       *unstructured.Unstructured // what is applied
	manager   string
	force     bool
	readsLive bool // the rule reads the object as it now is: decode the answer whole
	// before is the object as the reconcile found it; nil: a create.
	before object
	// action is create, update or adopt (syncloop_apply_total's action).
	action  string
	trigger rules.ObjectRef
	key     cache.ObjectName // the trigger's
	ch      *changes
}

// ref is the object the write is to.
func (w *write) ref() childRef { return refOf(w.obj) }

// liveWriter is the writer of a running syncloop.
type liveWriter struct {
	rule     string
	cluster  string // "": syncloop's own
	client   *dynamic.Writer
	writes   *ownWrites
	requeue  func(cache.ObjectName) // queues a trigger (an event missed during its apply)
	metrics  Metrics
	recorder record.EventRecorder // nil: no Events
	events   EventMode
}

func (lw *liveWriter) apply(ctx context.Context, w *write) (map[string]any, error) {
	ref := w.ref()
	if w.kind == writeChild {
		lw.writes.applying(ref)
	}
	// The answer is decoded whole only when the rule reads the object;
	// otherwise the applied object stands for it.
	live, rv := w.obj.Object, ""
	var err error
	if w.readsLive {
		out, aerr := lw.client.Apply(ctx, w.mapping, w.obj, w.manager, w.force)
		if err = aerr; err == nil {
			live, rv = out.Object, out.GetResourceVersion()
		}
	} else {
		rv, err = lw.client.ApplyVersion(ctx, w.mapping, w.obj, w.manager, w.force)
	}
	if w.kind == writeChild && lw.writes.applyDone(ref, rv) {
		lw.requeue(w.key)
	}
	if err != nil {
		return nil, err
	}
	if w.kind != writeChild {
		lw.writes.remember(ref, rv)
	} else if w.before != nil {
		lw.writes.replacedWith(ref, w.before.GetResourceVersion(), rules.Annotation(w.obj, rules.AnnotationAppliedHash))
	}
	lw.metrics.Write(lw.rule, w.action)
	logger := klog.FromContext(ctx)
	switch w.kind {
	case writeChild:
		logger.V(2).Info("Applied child", "action", w.action, "kind", ref.gvk.Kind, "child", klog.KObj(w.obj), "cluster", lw.cluster)
		lw.note(&w.ch.applied, appliedVerbs[w.action], ref)
		if w.action == ActionAdopt {
			logger.Info("Adopted an object syncloop did not create", "kind", ref.gvk.Kind, "object", klog.KObj(w.obj))
		}
	case writePatch:
		logger.V(2).Info("Patched object", "kind", ref.gvk.Kind, "object", klog.KObj(w.obj))
		lw.note(&w.ch.applied, "Patched", ref)
	case writeRelease:
		logger.V(2).Info("Released the fields of an object", "kind", ref.gvk.Kind, "object", klog.KObj(w.obj))
		lw.note(&w.ch.pruned, "Released", ref)
	}
	return live, nil
}

func (lw *liveWriter) delete(ctx context.Context, m *meta.RESTMapping, _ rules.ObjectRef, child object, ch *changes, propagation metav1.DeletionPropagation) error {
	ref := refOf(child)
	if !lw.writes.deleting(ref, child.GetUID()) {
		return nil // deleted already; the cache has not shown it
	}
	if err := lw.client.Delete(ctx, m, ref.namespace, ref.name, child.GetUID(), propagation); err != nil {
		if goneAlready(err) {
			// Someone else deleted it (the garbage collector, following
			// the trigger's ownerReference): as good as our own delete,
			// which is not made again until the cache shows it gone.
			return nil
		}
		lw.writes.deleteFailed(ref)
		return err
	}
	lw.writes.deleteDone(ref)
	lw.metrics.Write(lw.rule, ActionDelete)
	klog.FromContext(ctx).V(2).Info("Pruned child", "kind", ref.gvk.Kind, "child", klog.KObj(child), "cluster", lw.cluster)
	lw.note(&ch.pruned, "Deleted", ref)
	return nil
}

// appliedVerbs name a child's apply in a Normal Event, by action.
var appliedVerbs = map[string]string{ActionCreate: "Created", ActionUpdate: "Updated", ActionAdopt: "Adopted"}

// note lists one write of ref for the reconcile's Normal Event ("Created
// ConfigMap ns/name"), only when such Events are emitted (EventsAll): at
// the default, a write formats nothing for an Event that is not sent.
func (lw *liveWriter) note(list *[]string, verb string, ref childRef) {
	if lw.events == EventsAll {
		where := ""
		if lw.cluster != "" {
			where = " in cluster " + lw.cluster
		}
		*list = append(*list, verb+" "+ref.gvk.Kind+" "+cacheKey(ref)+where)
	}
}

// goneAlready reports whether the answer to a delete says its object was
// gone already, or replaced by another (the UID precondition failed):
// nothing to prune.
func goneAlready(err error) bool {
	if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return false
	}
	// Only an answer about the object itself: an API server starting up
	// answers 404 for every path it does not serve yet, naming nothing.
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d != nil && d.Name != ""
}

func (lw *liveWriter) status(ctx context.Context, m *meta.RESTMapping, _, patch *unstructured.Unstructured, manager string) error {
	if _, err := lw.client.ApplyStatus(ctx, m, patch, manager, true); err != nil {
		return err
	}
	lw.metrics.Write(lw.rule, ActionStatus)
	return nil
}

func (lw *liveWriter) mark(ctx context.Context, m *meta.RESTMapping, patch *unstructured.Unstructured, manager string) error {
	_, err := lw.client.Apply(ctx, m, patch, manager, true)
	return err
}

func (lw *liveWriter) unfinalize(ctx context.Context, m *meta.RESTMapping, trigger *unstructured.Unstructured, finalizer string) error {
	_, err := lw.client.RemoveFinalizers(ctx, m, trigger, func(f string) bool { return f == finalizer })
	return err
}

// tearingDown emits a TearingDown Event, whatever the Events setting: a
// deletion held by syncloop says why, once per wave.
func (lw *liveWriter) tearingDown(trigger *unstructured.Unstructured, msg string) {
	lw.event(trigger, corev1.EventTypeNormal, render.ReasonTearingDown, msg)
}

// held emits a LeaveHeld Warning Event when the trigger's children
// leaving a cluster are newly held there.
func (lw *liveWriter) held(trigger *unstructured.Unstructured, h leaveHold) {
	lw.metrics.Write(lw.rule, ActionWait)
	if h.news {
		lw.event(trigger, corev1.EventTypeWarning, ReasonLeaveHeld, h.String())
	}
}

func (lw *liveWriter) wait(*unstructured.Unstructured, *render.ResourceState) {
	lw.metrics.Write(lw.rule, ActionWait)
}

// unreachable is the trigger's Ready condition's (ClusterUnreachable)
// and the metric's.
func (lw *liveWriter) unreachable(*unstructured.Unstructured, render.Child, *render.UnreachableError) {
	lw.metrics.Write(lw.rule, ActionWait)
}

func (lw *liveWriter) conflict(trigger *unstructured.Unstructured, ce *render.ConflictError) {
	lw.metrics.Write(lw.rule, ActionConflict)
	lw.event(trigger, corev1.EventTypeWarning, render.ReasonChildConflict, ce.Error())
}

// failed emits a Failed Warning Event. A 429 is not a failure: the server
// asked syncloop to slow down, and the trigger is retried.
func (lw *liveWriter) failed(trigger *unstructured.Unstructured, err error) {
	if !apierrors.IsTooManyRequests(err) {
		lw.event(trigger, corev1.EventTypeWarning, "Failed", err.Error())
	}
}

// contended emits a Contended Warning Event, once per cooling period.
func (lw *liveWriter) contended(trigger *unstructured.Unstructured, ce *render.ContendedError) {
	lw.event(trigger, corev1.EventTypeWarning, render.ReasonContended, ce.Error())
}

// maxListed is how many writes one Normal Event names.
const maxListed = 5

// reconciled emits, with EventsAll, one Normal Event listing what the
// reconcile changed; nothing when it changed nothing.
func (lw *liveWriter) reconciled(trigger *unstructured.Unstructured, ch *changes) {
	if lw.events != EventsAll {
		return
	}
	all := append(append([]string{}, ch.applied...), ch.pruned...)
	if len(all) == 0 {
		return
	}
	reason := "Applied"
	if len(ch.applied) == 0 {
		reason = "Pruned"
	}
	msg := strings.Join(all[:min(len(all), maxListed)], ", ")
	if len(all) > maxListed {
		msg += fmt.Sprintf(" and %d more", len(all)-maxListed)
	}
	lw.event(trigger, corev1.EventTypeNormal, reason, msg)
}

func (lw *liveWriter) event(obj *unstructured.Unstructured, eventType, reason, msg string) {
	if lw.recorder != nil && obj != nil {
		lw.recorder.Event(obj, eventType, reason, msg)
	}
}

func (lw *liveWriter) ended(_ cache.ObjectName, err error) error { return err }
func (lw *liveWriter) dryRun() bool                              { return false }

// changes are the writes of one reconcile, for its Normal Event.
type changes struct {
	applied []string // "Created ConfigMap ns/name", "Updated …"
	pruned  []string // "Deleted ConfigMap ns/name"
}

// planWriter is the writer of a dry run: every request is a server-side
// dry run (dryRun=All: defaulting and admission apply, nothing is
// persisted), and what it would change is an Action for the Planner. It
// emits no Event and remembers no write: none was made.
type planWriter struct {
	rule    string
	cluster string          // "": syncloop's own
	client  *dynamic.Writer // DryRun set
	plan    Planner
	// once: a trigger that fails is reported and not retried (PlanOnce).
	once bool
}

func (pw *planWriter) apply(ctx context.Context, w *write) (map[string]any, error) {
	out, err := pw.client.Apply(ctx, w.mapping, w.obj, w.manager, w.force)
	if err != nil {
		return nil, err
	}
	a := Action{Action: w.action, Rule: pw.rule, Trigger: w.trigger, Object: rules.RefOf(w.obj), Cluster: pw.cluster}
	if w.before != nil {
		// The fields syncloop manages: those applied, or for a release
		// those the object had.
		before := wholeOf(w.before)
		shape := w.obj.Object
		if w.kind == writeRelease {
			shape = before.Object
		}
		a.Diff = diffObjects(groupKind(w.ref()), before.Object, out.Object, shape)
	}
	if w.before == nil || a.Diff != "" {
		pw.plan.Plan(a)
	}
	return out.Object, nil
}

func (pw *planWriter) delete(ctx context.Context, m *meta.RESTMapping, trigger rules.ObjectRef, child object, _ *changes, propagation metav1.DeletionPropagation) error {
	err := pw.client.Delete(ctx, m, child.GetNamespace(), child.GetName(), child.GetUID(), propagation)
	switch {
	case goneAlready(err):
		return nil
	case err != nil:
		return err
	}
	ref := refOf(child)
	apiVersion, kind := ref.gvk.ToAPIVersionAndKind()
	pw.plan.Plan(Action{Action: ActionDelete, Rule: pw.rule, Trigger: trigger, Cluster: pw.cluster,
		Object: rules.ObjectRef{APIVersion: apiVersion, Kind: kind, Namespace: ref.namespace, Name: ref.name}})
	return nil
}

func (pw *planWriter) status(ctx context.Context, m *meta.RESTMapping, trigger, patch *unstructured.Unstructured, manager string) error {
	out, err := pw.client.ApplyStatus(ctx, m, patch, manager, true)
	if err != nil {
		return err
	}
	shape := map[string]any{"status": patch.Object["status"]}
	if diff := diffObjects(groupKind(refOf(trigger)), trigger.Object, out.Object, shape); diff != "" {
		ref := rules.RefOf(trigger)
		pw.plan.Plan(Action{Action: ActionStatus, Rule: pw.rule, Trigger: ref, Object: ref, Diff: diff})
	}
	return nil
}

func (pw *planWriter) mark(context.Context, *meta.RESTMapping, *unstructured.Unstructured, string) error {
	return nil
}

func (pw *planWriter) unfinalize(context.Context, *meta.RESTMapping, *unstructured.Unstructured, string) error {
	return nil
}

// wait plans a resource that would wait, its object named as far as the
// template is literal.
func (pw *planWriter) wait(trigger *unstructured.Unstructured, st *render.ResourceState) {
	res := st.Resource
	kind := res.Kind
	if res.Computed() {
		kind = "(" + res.KindNames() + ")"
	}
	pw.plan.Plan(Action{Action: ActionWait, Rule: pw.rule, Trigger: rules.RefOf(trigger), Resource: res.ID,
		Object: rules.ObjectRef{APIVersion: res.APIVersion, Kind: kind, Namespace: res.LiteralNamespace, Name: res.LiteralName},
		Reason: st.Why})
}

// unreachable plans a child in a cluster that cannot be reached as a
// wait: what it would write there is not known, and is not nothing.
func (pw *planWriter) unreachable(trigger *unstructured.Unstructured, child render.Child, ue *render.UnreachableError) {
	pw.plan.Plan(Action{Action: ActionWait, Rule: pw.rule, Trigger: rules.RefOf(trigger), Resource: child.ResourceID,
		Object: objectRef(child.Object), Cluster: ue.Cluster, Reason: ue.Why})
}

// held plans each child held in the cluster it leaves as a wait.
func (pw *planWriter) held(trigger *unstructured.Unstructured, h leaveHold) {
	for _, c := range h.children {
		pw.plan.Plan(Action{Action: ActionWait, Rule: pw.rule, Trigger: rules.RefOf(trigger), Object: objectRef(c), Cluster: h.cluster,
			Resource: rules.Annotation(c, rules.AnnotationResourceID), Reason: "leaving the cluster, held: " + h.why})
	}
}

func (pw *planWriter) conflict(trigger *unstructured.Unstructured, ce *render.ConflictError) {
	pw.plan.Plan(Action{Action: ActionConflict, Rule: pw.rule, Trigger: rules.RefOf(trigger), Object: ce.Object,
		Resource: ce.Resource, Reason: ce.Error()})
}

func (pw *planWriter) tearingDown(*unstructured.Unstructured, string)               {}
func (pw *planWriter) failed(*unstructured.Unstructured, error)                     {}
func (pw *planWriter) contended(*unstructured.Unstructured, *render.ContendedError) {}
func (pw *planWriter) reconciled(*unstructured.Unstructured, *changes)              {}

// ended reports a failure to the Planner — a conflict is a line of the
// plan already. A plan of one pass has no later pass: its failures are
// terminal.
func (pw *planWriter) ended(key cache.ObjectName, err error) error {
	if err == nil {
		return nil
	}
	if !render.OnlyConflicts(err) {
		pw.plan.Failed(pw.rule, key.String(), err)
	}
	if pw.once {
		return terminal(err)
	}
	return err
}

func (pw *planWriter) dryRun() bool { return true }
