package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
)

// revisionKeeper records every version of a rule put in force as a
// revision: an apps/v1 ControllerRevision in syncloop's namespace, named
// <rule>-<hash> (<installation>-<rule>-<hash> for a named installation),
// labelled with the rule, holding the rule's source, numbered in the order
// the versions came. A version that comes back — a change undone — is the
// revision it was, renumbered as the newest, as a Deployment's rollback
// is. The newest RevisionHistoryLimit of each rule are kept, the others
// deleted; a rule removed from the files keeps its revisions. Only a
// replica that runs the rules writes them.
//
// It is also the engine's RolloutStore: a rollout's record is an
// annotation (rules.AnnotationRollout) of the revision it rolls out to, and each
// transition an Event on that object.
type revisionKeeper struct {
	store        *dynamic.Revisions
	installation string
	// compile compiles a recorded revision (the rule a rollout moves
	// from); recorder emits the rollouts' Events (nil: none).
	compile  func(r *rules.Rule, name string, source []byte) (*rules.Rule, error)
	recorder record.EventRecorder
	// compileRemoved, when set, compiles a removed rule's last revision
	// instead: its removal calls no function, so it compiles whether or
	// not this process has its modules (rules.Loader.ForInspection).
	compileRemoved func(r *rules.Rule, name string, source []byte) (*rules.Rule, error)

	mu sync.Mutex
	// seen are each rule's revisions as the last keep listed them, before
	// it recorded the version put in force: where a rollout resumes from.
	seen map[string][]appsv1.ControllerRevision
	// failures are the rules whose revision the last keep could not
	// record, and why, for /readyz.
	failures atomic.Pointer[[]string]
	// panicked counts the panics a keep contains; nil: not counted.
	panicked func(rule, where string)
	// removing are the revisions of removed rules Removed returned, by
	// rule; nothingToRemove those with no removal to do.
	removing        map[string]string
	nothingToRemove map[string]bool
	// unrecorded are the versions in force here whose revision a keep
	// could not record, by rule: recorded by a later keep even once
	// their file is broken (owed).
	unrecorded map[string]unrecorded
	// newest is the highest revision number of each rule this keeper
	// has listed or recorded: what an unrecorded version is newer than.
	newest map[string]int64
}

// unrecorded is a version put in force whose revision was not recorded:
// its hash, and the newest revision of its rule when that failed.
type unrecorded struct {
	hash   string
	newest int64
}

func newRevisionKeeper(c *Clients, namespace, installation string) *revisionKeeper {
	return &revisionKeeper{store: dynamic.NewRevisions(c.Core, namespace), installation: installation}
}

// failed are the rules whose revision the last keep could not record.
func (k *revisionKeeper) failed() []string {
	if f := k.failures.Load(); f != nil {
		return *f
	}
	return nil
}

// selector selects this installation's revisions.
func (k *revisionKeeper) selector() string {
	sel := rules.LabelManagedBy + "=" + rules.ManagedByValue + ","
	if k.installation == "" {
		return sel + "!" + rules.LabelInstallation
	}
	return sel + rules.LabelInstallation + "=" + k.installation
}

// name is the revision's object name.
func (k *revisionKeeper) name(r *rules.Rule) string {
	name := r.Name + "-" + r.Hash[:10]
	if k.installation != "" {
		name = k.installation + "-" + name
	}
	return name
}

// keep records the revision of every rule of set and prunes each rule's
// history to its limit: one LIST, and a write only for a rule whose
// version in force is not the newest revision already. A rule of a file
// that does not load (broken: true when its last good version is in
// force) is not recorded: its version was when it was loaded, and if it
// is not the newest any more another replica loaded the file's next
// version (lastGood puts that in force here) — recording it again would
// make it the newest over theirs, and replicas would take turns at it.
// The exception is a version whose recording failed while its file
// loaded, and whose rule has no newer revision since (owed): a start
// with the file broken runs what ran here, not the version before. Nor
// is a rule put in force from a revision. It then keeps the newest
// revisions' source files true (sources). It reports whether a write
// failed: the caller keeps again until none does.
func (k *revisionKeeper) keep(ctx context.Context, set *rules.Set, broken map[string]bool) (failed bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	logger := klog.FromContext(ctx)
	var failures []string
	defer func() { k.failures.Store(&failures) }()
	fail := func(r *rules.Rule, err error) {
		logger.Error(err, "Recording the rule's revision", "rule", r.Name, "namespace", k.store.Namespace())
		failures = append(failures, fmt.Sprintf("revision of rule %s: %v", r.Name, err))
		failed = true
		if u, ok := k.unrecorded[r.Name]; !ok || u.hash != r.Hash {
			if k.unrecorded == nil {
				k.unrecorded = map[string]unrecorded{}
			}
			k.unrecorded[r.Name] = unrecorded{hash: r.Hash, newest: k.newest[r.Name]}
		}
	}
	byRule, err := k.list(ctx)
	if err != nil {
		for _, r := range set.Rules() {
			if k.recordable(r, broken, k.seen[r.Name]) {
				fail(r, err)
			}
		}
		return failed
	}
	loaded := map[string]time.Time{}
	for _, f := range set.Files() {
		loaded[f.Path] = f.LoadedAt
	}
	for _, r := range set.Rules() {
		if !k.recordable(r, broken, byRule[r.Name]) {
			continue
		}
		keepOne := func() error { return k.keepOne(ctx, r, loaded[r.Pos.File], byRule[r.Name]) }
		if err := containRule(logger, k.panicked, r.Name, panicRevisions, keepOne); err != nil {
			fail(r, err)
		} else {
			delete(k.unrecorded, r.Name)
		}
	}
	for name := range k.unrecorded {
		if set.Get(name) == nil {
			delete(k.unrecorded, name)
		}
	}
	if err := k.sources(ctx, set, byRule, broken); err != nil {
		logger.Error(err, "Recording where the rules in force come from", "namespace", k.store.Namespace())
	}
	return failed
}

// recordable reports whether keep records r, its rule's revisions revs:
// not when r was put in force from a revision, nor when r's file is
// broken — unless r's revision is owed: its recording failed, and revs
// has no revision newer than the newest then (no other replica recorded
// the file's next version meanwhile).
func (k *revisionKeeper) recordable(r *rules.Rule, broken map[string]bool, revs []appsv1.ControllerRevision) bool {
	if strings.HasPrefix(r.Pos.File, revisionSource) {
		return false
	}
	if _, ok := broken[r.Pos.File]; !ok {
		return true
	}
	u, ok := k.unrecorded[r.Name]
	return ok && u.hash == r.Hash && newestRevision(revs) == u.newest
}

// newestRevision is the highest revision number among revs; 0: none.
func newestRevision(revs []appsv1.ControllerRevision) int64 {
	var n int64
	for _, cr := range revs {
		n = max(n, cr.Revision)
	}
	return n
}

// keepOne records r's revision among revs, its revisions listed, and
// deletes the oldest beyond the limit; the newest, in force, never, nor
// the one a rollout moves from. loaded is when r's file content was
// first read here (zero: not known).
func (k *revisionKeeper) keepOne(ctx context.Context, r *rules.Rule, loaded time.Time, listed []appsv1.ControllerRevision) error {
	rolling := rolledFrom(listed, r)
	revs, err := k.record(ctx, r, loaded, listed)
	if err != nil {
		return err
	}
	k.newest[r.Name] = max(k.newest[r.Name], newestRevision(revs))
	excess := len(revs) - r.RevisionHistoryLimit
	for _, cr := range revs[:len(revs)-1] {
		if excess <= 0 {
			break
		}
		if rolling[cr.Name] {
			continue
		}
		if err := k.store.Delete(ctx, cr); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		excess--
	}
	return nil
}

// rolledFrom are the revisions among revs (oldest first, before r is
// recorded) that a rollout to r may move from: the newest when r is not it
// (a rollout begins from it), and the one the newest's unfinished rollout
// came from. Pruning the history keeps them, whatever its limit: the
// triggers not moved yet are reconciled by them after a restart.
func rolledFrom(revs []appsv1.ControllerRevision, r *rules.Rule) map[string]bool {
	out := map[string]bool{}
	if len(revs) == 0 {
		return out
	}
	newest := revs[len(revs)-1]
	if newest.Annotations[rules.AnnotationRuleHash] != r.Hash {
		out[newest.Name] = true
	}
	if rec := rolloutOf(newest); rec != nil && rec.Unfinished() {
		for _, cr := range revs {
			if cr.Annotations[rules.AnnotationRuleHash] == rec.From {
				out[cr.Name] = true
			}
		}
	}
	return out
}

// list reads this installation's revisions, by rule, oldest first, and
// keeps them as those a rollout resumes from (Resume).
func (k *revisionKeeper) list(ctx context.Context) (map[string][]appsv1.ControllerRevision, error) {
	all, err := k.store.List(ctx, k.selector())
	if err != nil {
		return nil, err
	}
	byRule := map[string][]appsv1.ControllerRevision{}
	if k.newest == nil {
		k.newest = map[string]int64{}
	}
	for _, cr := range all {
		rule := cr.Labels[rules.LabelRule]
		byRule[rule] = append(byRule[rule], cr)
		k.newest[rule] = max(k.newest[rule], cr.Revision)
	}
	k.seen = byRule
	return byRule, nil
}

// record makes r's version, its file's content first read at loaded,
// the newest of its revisions revs (oldest first), and returns them as
// they then are — unless the newest is a version of the same file loaded
// after r's: another replica read the file's next version and recorded
// it before this one's recording of the version before came in (slow,
// or retried). This replica loads that version next.
func (k *revisionKeeper) record(ctx context.Context, r *rules.Rule, loaded time.Time, revs []appsv1.ControllerRevision) ([]appsv1.ControllerRevision, error) {
	var newest int64
	mine, last := -1, -1
	for i, cr := range revs {
		newest = max(newest, cr.Revision)
		if cr.Annotations[rules.AnnotationRuleHash] == r.Hash {
			mine = i
		}
		if last < 0 || newerRevision(cr, revs[last]) {
			last = i
		}
	}
	switch {
	case mine >= 0 && revs[mine].Revision == newest:
		return revs, nil
	case last >= 0 && revs[last].Annotations[rules.AnnotationSourceFile] == r.Pos.File && loadedAt(revs[last]).After(loaded) && !loaded.IsZero():
		return revs, nil
	case mine >= 0:
		cr := revs[mine]
		cr.Annotations = withLoadedAt(cr.Annotations, loaded)
		if err := k.store.Renumber(ctx, cr, newest+1); apierrors.IsConflict(err) {
			return revs, nil // another replica of a sharded group renumbered it
		} else if err != nil {
			return nil, err
		}
		cr.Revision = newest + 1
		return append(append(revs[:mine:mine], revs[mine+1:]...), cr), nil
	}
	labels := map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: r.Name}
	if k.installation != "" {
		labels[rules.LabelInstallation] = k.installation
	}
	name := k.name(r)
	annotations := withLoadedAt(map[string]string{rules.AnnotationRuleHash: r.Hash}, loaded)
	if r.Pos.File != "" && !strings.HasPrefix(r.Pos.File, revisionSource) {
		annotations[rules.AnnotationSourceFile] = r.Pos.File
	}
	err := k.store.Create(ctx, name, labels, annotations, r.Source, newest+1)
	if err != nil && !apierrors.IsAlreadyExists(err) { // another replica of a sharded group was first
		return nil, err
	}
	// Counted, and numbered as made (or as the replica first to it did);
	// the oldest are what pruning deletes.
	return append(revs, appsv1.ControllerRevision{Revision: newest + 1}), nil
}

// loadedAt is when the file content cr's version came from was first
// read by the replica that recorded it (rules.AnnotationLoadedAt); zero
// when not recorded.
func loadedAt(cr appsv1.ControllerRevision) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, cr.Annotations[rules.AnnotationLoadedAt])
	return t
}

// withLoadedAt is annotations (a copy) with loaded recorded, when known.
func withLoadedAt(annotations map[string]string, loaded time.Time) map[string]string {
	out := make(map[string]string, len(annotations)+1)
	for k, v := range annotations {
		out[k] = v
	}
	if !loaded.IsZero() {
		out[rules.AnnotationLoadedAt] = loaded.UTC().Format(time.RFC3339Nano)
	}
	return out
}

// newerRevision reports whether a is newer than b: numbered higher, or
// numbered the same (two replicas recorded at once) and its content
// loaded later.
func newerRevision(a, b appsv1.ControllerRevision) bool {
	if a.Revision != b.Revision {
		return a.Revision > b.Revision
	}
	return loadedAt(a).After(loadedAt(b))
}

// Revision is one recorded version of a rule.
type Revision struct {
	Rule     string    `json:"rule"`
	Revision int64     `json:"revision"`
	Name     string    `json:"name"`
	Hash     string    `json:"hash"`
	Created  time.Time `json:"created"`
	// Newest: the version put in force last.
	Newest bool `json:"newest"`
	// Rollout is the rollout to this revision, if it had one.
	Rollout *rollout.Record `json:"rollout,omitempty"`
	// Removal is what removing the rule did, on its newest revision.
	Removal *engine.RemovalRecord `json:"removal,omitempty"`
}

// RolloutSummary says where the rollout to r stands, in lines made
// printable; "" when it had none.
func (r Revision) RolloutSummary() string {
	ro := r.Rollout
	if ro == nil {
		return ""
	}
	rule, revision := r.Rule, r.Revision
	line := fmt.Sprintf("rollout of %s to revision %d: %s: step %d of %d, %d of %d triggers moved", rule, revision, ro.State, ro.Step, ro.Steps, ro.Moved, ro.Total)
	if ro.Pruned > 0 {
		line += fmt.Sprintf(", %d children removed", ro.Pruned)
	}
	if !ro.Started.IsZero() {
		line += fmt.Sprintf(", started %s ago", time.Since(ro.Started).Round(time.Second))
	}
	// Its record is an annotation of the revision: each line printable.
	line = printable.Text(line)
	if ro.Message != "" {
		line += "\n  " + printable.Text(ro.Reason+": "+ro.Message)
	}
	return line
}

// RemovalSummary says what removing r's rule did, in lines made
// printable; "" when it was not removed.
func (r Revision) RemovalSummary() string {
	rm, rule := r.Removal, r.Rule
	if rm == nil {
		return ""
	}
	line := printable.Text(fmt.Sprintf("removal of %s: %s %s ago: %d of %d children deleted, the finalizer taken off %d triggers",
		rule, rm.State, time.Since(rm.At).Round(time.Second), rm.Deleted, rm.Children, rm.Released))
	if rm.Message != "" {
		line += "\n  " + printable.Text(rm.Message)
	}
	return line
}

// Revisions lists the revisions of the rules of installation recorded in
// namespace (only rule's, when not ""), by rule, newest first.
func Revisions(ctx context.Context, c *Clients, namespace, installation, rule string) ([]Revision, error) {
	k := newRevisionKeeper(c, namespace, installation)
	sel := k.selector()
	if rule != "" {
		sel += "," + rules.LabelRule + "=" + rule
	}
	list, err := k.store.List(ctx, sel)
	if err != nil {
		return nil, err
	}
	newest := map[string]int64{}
	for _, cr := range list {
		newest[cr.Labels[rules.LabelRule]] = max(newest[cr.Labels[rules.LabelRule]], cr.Revision)
	}
	out := make([]Revision, 0, len(list))
	for _, cr := range list {
		r := cr.Labels[rules.LabelRule]
		out = append(out, Revision{Rule: r, Revision: cr.Revision, Name: cr.Name, Hash: cr.Annotations[rules.AnnotationRuleHash],
			Created: cr.CreationTimestamp.Time, Newest: cr.Revision == newest[r], Rollout: rolloutOf(cr), Removal: removalOf(cr)})
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Rule != out[j].Rule {
			return out[i].Rule < out[j].Rule
		}
		return out[i].Revision > out[j].Revision
	})
	return out, nil
}

// rolloutOf is the rollout recorded on cr; nil if none (or unreadable).
func rolloutOf(cr appsv1.ControllerRevision) *rollout.Record {
	return recordOf[rollout.Record](cr, rules.AnnotationRollout)
}

// Resume implements engine.RolloutStore from the revisions the last keep
// listed. When r's version was already the newest, a rollout recorded on
// it that had not ended goes on; when r is new, a rollout begins from the
// newest — or, if that one's own rollout had not ended, from where that
// one came, with what it had moved.
func (k *revisionKeeper) Resume(_ context.Context, r *rules.Rule) (*rollout.Record, *rules.Rule, error) {
	k.mu.Lock()
	revs := k.seen[r.Name]
	k.mu.Unlock()
	if len(revs) == 0 || k.compile == nil {
		return nil, nil, nil
	}
	byHash := map[string]appsv1.ControllerRevision{}
	for _, cr := range revs {
		byHash[cr.Annotations[rules.AnnotationRuleHash]] = cr
	}
	newest := revs[len(revs)-1]
	rec := rolloutOf(newest)
	unfinished := rec != nil && rec.Unfinished()
	if newest.Annotations[rules.AnnotationRuleHash] == r.Hash {
		if !unfinished {
			return nil, nil, nil
		}
		from, ok := byHash[rec.From]
		if !ok {
			return nil, nil, fmt.Errorf("the revision its rollout moves from (%s) is no longer recorded", rec.From)
		}
		compiled, err := k.compile(r, from.Name, from.Data.Raw)
		return rec, compiled, err
	}
	from, begin := newest, &rollout.Record{}
	if unfinished {
		if older, ok := byHash[rec.From]; ok {
			from = older
			if rec.State != rollout.RolledBack {
				begin.Threshold, begin.Started = rec.Threshold, rec.Started
			}
		}
	}
	if from.Annotations[rules.AnnotationRuleHash] == r.Hash {
		return nil, nil, nil // put back
	}
	compiled, err := k.compile(r, from.Name, from.Data.Raw)
	return begin, compiled, err
}

// Record implements engine.RolloutStore: rec becomes the annotation of
// r's revision, and the transition an Event on it.
func (k *revisionKeeper) Record(ctx context.Context, r *rules.Rule, rec rollout.Record, eventType, reason, message string) {
	data, err := json.Marshal(rec)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cr, err := k.store.Annotate(ctx, k.name(r), rules.AnnotationRollout, string(data))
	if err != nil {
		klog.FromContext(ctx).Error(err, "Recording the rule's rollout", "rule", r.Name, "revision", k.name(r))
		return
	}
	if reason != "" && k.recorder != nil {
		k.recorder.Event(cr, eventType, reason, message)
	}
}

// Fetch implements engine.RolloutStore: the rollout recorded on r's
// revision now.
func (k *revisionKeeper) Fetch(ctx context.Context, r *rules.Rule) (*rollout.Record, error) {
	cr, err := k.store.Get(ctx, k.name(r))
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return rolloutOf(*cr), nil
}
