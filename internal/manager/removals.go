package manager

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/rules"
)

// removalOf is the removal recorded on cr, or nil.
func removalOf(cr appsv1.ControllerRevision) *engine.RemovalRecord {
	return recordOf[engine.RemovalRecord](cr, rules.AnnotationRemoval)
}

// recordOf is the JSON record in cr's annotation key, or nil.
func recordOf[T any](cr appsv1.ControllerRevision, key string) *T {
	s, ok := cr.Annotations[key]
	if !ok {
		return nil
	}
	var rec T
	if json.Unmarshal([]byte(s), &rec) != nil {
		return nil
	}
	return &rec
}

// Removed implements engine.RolloutStore: of the rules whose revisions
// this installation recorded and set does not hold, the newest revision
// of each whose removal is not recorded, compiled, when it has a removal
// to do (it orders its teardown, or deletes its children on removal). A
// revision that no longer compiles (its kinds gone) is passed over, with
// a log line; one with nothing to do is remembered, not compiled again.
func (k *revisionKeeper) Removed(ctx context.Context, set *rules.Set) ([]*rules.Rule, error) {
	compile := k.compile
	if k.compileRemoved != nil {
		compile = k.compileRemoved
	}
	if compile == nil {
		return nil, nil
	}
	all, err := k.store.List(ctx, k.selector())
	if err != nil {
		return nil, err
	}
	newest := map[string]appsv1.ControllerRevision{}
	for _, cr := range all {
		name := cr.Labels[rules.LabelRule]
		if n, ok := newest[name]; !ok || cr.Revision > n.Revision {
			newest[name] = cr
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.removing == nil {
		k.removing, k.nothingToRemove = map[string]string{}, map[string]bool{}
	}
	var out []*rules.Rule
	for name, cr := range newest {
		if set.Get(name) != nil || removalOf(cr) != nil || k.nothingToRemove[cr.Name] {
			continue
		}
		stub := &rules.Rule{Name: name}
		if ns, _, tenant := strings.Cut(name, "."); tenant {
			stub.Tenant = ns // a tenant rule is named <namespace>.<name>
		}
		r, err := compile(stub, cr.Name, cr.Data.Raw)
		if err != nil {
			klog.FromContext(ctx).Info("A removed rule's last revision no longer compiles: nothing is done on its removal", "rule", name, "revision", cr.Name, "err", err)
			k.nothingToRemove[cr.Name] = true
			continue
		}
		if r.RemovalPolicy != rules.DeletionDelete && !r.OrdersTeardown() {
			k.nothingToRemove[cr.Name] = true
			continue
		}
		k.removing[name] = cr.Name
		out = append(out, r)
	}
	return out, nil
}

// RecordRemoval implements engine.RolloutStore: rec becomes the annotation
// of the removed rule's newest revision, and an Event on it says so.
func (k *revisionKeeper) RecordRemoval(ctx context.Context, r *rules.Rule, rec engine.RemovalRecord, eventType, reason, message string) {
	k.mu.Lock()
	name := k.removing[r.Name]
	k.mu.Unlock()
	data, err := json.Marshal(rec)
	if err != nil || name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cr, err := k.store.Annotate(ctx, name, rules.AnnotationRemoval, string(data))
	if err != nil {
		klog.FromContext(ctx).Error(err, "Recording the rule's removal", "rule", r.Name, "revision", name)
		return
	}
	if message == "" {
		message = "removed"
	}
	if k.recorder != nil {
		k.recorder.Event(cr, eventType, reason, message)
	}
}
