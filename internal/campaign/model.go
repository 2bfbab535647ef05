package campaign

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/offline"
)

// record appends what the rule wants now to the history, as from at.
func (w *world) record(at time.Time) error {
	desired, err := w.model(context.Background(), w.objects())
	if err != nil {
		return err
	}
	w.history = append(w.history, snapshot{at: at, desired: desired})
	return nil
}

// objects are the objects the generator has made, as the offline
// renderer takes them.
func (w *world) objects() []*unstructured.Unstructured {
	var cms []*corev1.ConfigMap
	for _, name := range w.existing() {
		cms = append(cms, w.triggers[name])
	}
	if w.source != nil {
		cms = append(cms, w.source)
	}
	for name, f := range w.foreign {
		if f.deleted.IsZero() {
			cms = append(cms, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workNS, UID: f.uid,
				Labels: map[string]string{"owner": "someone-else"}}})
		}
	}
	out := asObjects(cms)
	for _, name := range tallyNames {
		if t := w.tallies[name]; t != nil {
			out = append(out, t)
		}
	}
	return out
}

func asObjects(cms []*corev1.ConfigMap) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(cms))
	for _, cm := range cms {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cm)
		if err != nil {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion("v1")
		u.SetKind("ConfigMap")
		out = append(out, u)
	}
	return out
}

// model is what the rules in force want of objects: `syncloop render`'s
// answer, the children by name (those an object of someone else's holds
// the name of are not wanted: conflicts).
func (w *world) model(ctx context.Context, objects []*unstructured.Unstructured) (map[string]desiredChild, error) {
	m, err := w.modelWithStatus(ctx, objects)
	if err != nil {
		return nil, err
	}
	return m.children, nil
}

// modelled is the model's answer: the children by name, and the status
// of each trigger whose rule has one, by namespace/name.
type modelled struct {
	children map[string]desiredChild
	statuses map[string]map[string]any
}

func (w *world) modelWithStatus(ctx context.Context, objects []*unstructured.Unstructured) (*modelled, error) {
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		return nil, err
	}
	f, err := l.Parse("rules.yaml", []byte(ruleFile(w.gen)))
	if err != nil {
		return nil, err
	}
	set, err := rules.NewSet(f)
	if err != nil {
		return nil, err
	}
	report, err := offline.Render(ctx, set, objects, "")
	if err != nil {
		return nil, err
	}
	out := &modelled{children: map[string]desiredChild{}, statuses: map[string]map[string]any{}}
	for _, r := range report.Results {
		if r.Error != "" {
			return nil, fmt.Errorf("the model: trigger %s: %s", r.Trigger.Name, r.Error)
		}
		for _, c := range r.Children {
			u := &unstructured.Unstructured{Object: c}
			data, _ := c["data"].(map[string]any)
			out.children[u.GetName()] = desiredChild{ownerUID: u.GetLabels()[rules.LabelOwnerUID], data: data}
		}
		if r.Status != nil {
			out.statuses[r.Trigger.Namespace+"/"+r.Trigger.Name] = r.Status
		}
	}
	return out, nil
}

// foreignAt reports whether name was an object of someone else's at t.
func (w *world) foreignAt(name string, t time.Time) bool {
	f := w.foreign[name]
	return f != nil && !t.Before(f.created) && (f.deleted.IsZero() || t.Before(f.deleted))
}

// wantedThroughout reports whether child name, of the trigger with
// ownerUID, was wanted by every snapshot from from to to.
func (w *world) wantedThroughout(name, ownerUID string, from, to time.Time) bool {
	i := sort.Search(len(w.history), func(i int) bool { return w.history[i].at.After(from) })
	if i > 0 {
		i-- // the snapshot in effect at from
	}
	seen := false
	for ; i < len(w.history) && !w.history[i].at.After(to); i++ {
		c, ok := w.history[i].desired[name]
		if !ok || c.ownerUID != ownerUID {
			return false
		}
		seen = true
	}
	return seen
}

// changes counts the writes the history asks for: children made or
// changed from one snapshot to the next, and drifted children repaired.
func (w *world) changes() int {
	n := len(w.drifted)
	prev := map[string]desiredChild{}
	for _, s := range w.history {
		for name, c := range s.desired {
			if p, ok := prev[name]; !ok || p.ownerUID != c.ownerUID || !sameData(p.data, c.data) {
				n++
			}
		}
		prev = s.desired
	}
	return n
}

func sameData(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// opsDone lists the changes made, by kind.
func (w *world) opsDone() string { return describe(w.ops) }
