package engine

import (
	"context"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// FightPolicy says when a child another writer keeps changing is a fight:
// Repairs drift repairs within Window. syncloop then stops repairing it
// for Cooling, doubling while the fight goes on, up to MaxCooling; a
// Window without a fight ends it.
type FightPolicy struct {
	Repairs             int
	Window              time.Duration
	Cooling, MaxCooling time.Duration
}

// DefaultFightPolicy: five repairs in a minute are a fight; syncloop
// leaves the child for 30 seconds, then a minute, two… up to half an hour.
var DefaultFightPolicy = FightPolicy{Repairs: 5, Window: time.Minute, Cooling: 30 * time.Second, MaxCooling: 30 * time.Minute}

// fights is a rule's record of the drift it repaired, by child: when the
// same child is repaired too often, the fight with whoever undoes the
// repairs is said once and repairs stop for a cooling period, instead of
// a hot loop of writes at the API server's expense that hides its cause.
// It has its own lock: workers and event handlers call it.
type fights struct {
	policy FightPolicy
	mu     sync.Mutex
	m      map[childRef]*fight
}

// fight is one child's repairs.
type fight struct {
	repairs   []time.Time // within the policy's window, oldest first
	coolUntil time.Time
	cooling   time.Duration          // the last cooling period; 0 after a window of peace
	said      *render.ContendedError // what the cooling under way was said as
}

func newFights(p FightPolicy) *fights {
	if p.Repairs == 0 {
		p = DefaultFightPolicy
	}
	return &fights{policy: p, m: map[childRef]*fight{}}
}

// repair decides whether a repair of ref's drift goes ahead at now. When
// it does not, cooling says until when; started is true for the repair
// that starts the cooling (to be said), and said is what the cooling
// under way was said as (nil when it starts now).
func (f *fights) repair(ref childRef, now time.Time) (ok, started bool, until time.Time, said *render.ContendedError) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.policy
	fg := f.m[ref]
	if fg == nil {
		fg = &fight{}
		f.m[ref] = fg
	}
	if now.Before(fg.coolUntil) {
		return false, false, fg.coolUntil, fg.said
	}
	fg.repairs = slices.DeleteFunc(fg.repairs, func(t time.Time) bool { return now.Sub(t) > p.Window })
	if len(fg.repairs) == 0 && now.Sub(fg.coolUntil) > p.Window {
		fg.cooling = 0 // a window of peace: the fight is over
	}
	if len(fg.repairs) < p.Repairs {
		fg.repairs = append(fg.repairs, now)
		return true, false, time.Time{}, nil
	}
	fg.cooling = min(max(2*fg.cooling, p.Cooling), p.MaxCooling)
	fg.coolUntil, fg.repairs, fg.said = now.Add(fg.cooling), nil, nil
	return false, true, fg.coolUntil, nil
}

// say records how the cooling of ref under way was said.
func (f *fights) say(ref childRef, ce *render.ContendedError) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fg := f.m[ref]; fg != nil {
		fg.said = ce
	}
}

// gone forgets ref: the child is deleted.
func (f *fights) gone(ref childRef) {
	f.mu.Lock()
	delete(f.m, ref)
	f.mu.Unlock()
}

// repairDrift decides whether a drifted child — what the rule wants has
// not changed since syncloop applied it, the object has — is repaired
// now. It reads the object's managedFields (the caches drop them) to name
// who changed the fields, and counts and logs the repair; in a fight it
// returns the ContendedError the child is left with, and has the trigger
// reconciled again when the cooling ends.
func (rc *reconciler) repairDrift(ctx context.Context, trigger *unstructured.Unstructured, key cache.ObjectName, child render.Child, m *meta.RESTMapping) *render.ContendedError {
	desired := child.Object
	ref := refOf(desired)
	now := time.Now()
	ok, started, until, said := rc.fights.repair(ref, now)
	if said != nil {
		return said
	}
	managers, fields := rc.changedBy(ctx, m, desired)
	if ok {
		for _, by := range orUnknown(managers) {
			rc.metrics.DriftRepaired(rc.rule.Name, by)
		}
		klog.FromContext(ctx).Info("Repairing drift", "kind", ref.gvk.Kind, "child", klog.KObj(desired), "changedBy", managers, "fields", fields)
		return nil
	}
	ce := &render.ContendedError{Resource: child.ResourceID, Object: rules.RefOf(desired), Managers: managers, Fields: fields,
		Repairs: rc.fights.policy.Repairs, Until: until}
	if started {
		rc.fights.say(ref, ce)
		rc.out.contended(trigger, ce)
	}
	rc.later(key, until.Sub(now))
	return ce
}

// orUnknown is managers, or "unknown" when none could be told.
func orUnknown(managers []string) []string {
	if len(managers) == 0 {
		return []string{"unknown"}
	}
	return managers
}

// changedBy reads desired's object and says which fields desired sets
// hold other values there, and which field managers other than the
// rule's own hold them: the writers a repair undoes. A field syncloop's
// own manager holds with another value was changed in its own request (a
// mutating webhook): its manager is named then.
func (rc *reconciler) changedBy(ctx context.Context, m *meta.RESTMapping, desired *unstructured.Unstructured) (managers, fields []string) {
	live, err := rc.client.Get(ctx, m, desired.GetNamespace(), desired.GetName())
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Cannot read a drifted child's managers", "child", klog.KObj(desired), "err", err)
		return nil, nil
	}
	fields = drifted(desired.Object, live.Object, "")
	own := rc.rule.FieldManager()
	var mine bool
	for _, e := range live.GetManagedFields() {
		if e.FieldsV1 == nil {
			continue
		}
		var set fieldpath.Set
		if set.FromJSON(e.FieldsV1.GetRawReader()) != nil {
			continue
		}
		holds := false
		set.Leaves().Iterate(func(p fieldpath.Path) {
			holds = holds || slices.ContainsFunc(fields, func(f string) bool { return under(p.String(), f) })
		})
		switch {
		case !holds:
		case e.Manager == own:
			mine = true
		case !slices.Contains(managers, e.Manager):
			managers = append(managers, e.Manager)
		}
	}
	if len(managers) == 0 && mine {
		managers = []string{own}
	}
	sort.Strings(managers)
	return managers, fields
}

// drifted lists the paths (".data.k") of the fields desired sets that
// live holds other values of; a list is compared whole, as it is applied.
func drifted(desired, live map[string]any, at string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(desired)) {
		if at == "" && (k == "metadata" || k == "apiVersion" || k == "kind") {
			if k == "metadata" {
				if dm, ok := desired[k].(map[string]any); ok {
					lm, _ := live[k].(map[string]any)
					for _, sub := range []string{"labels", "annotations"} {
						dl, _ := dm[sub].(map[string]any)
						ll, _ := lm[sub].(map[string]any)
						out = append(out, drifted(dl, ll, ".metadata."+sub)...)
					}
				}
			}
			continue
		}
		path := at + "." + k
		dv, lv := desired[k], live[k]
		if dm, ok := dv.(map[string]any); ok {
			if lm, ok := lv.(map[string]any); ok {
				out = append(out, drifted(dm, lm, path)...)
				continue
			}
		}
		if !holds(lv, dv) {
			out = append(out, path)
		}
	}
	return out
}

// under reports whether the field at path p (fieldpath's form) is the
// field at f or inside it.
func under(p, f string) bool {
	rest, ok := strings.CutPrefix(p, f)
	return ok && (rest == "" || rest[0] == '.' || rest[0] == '[')
}
