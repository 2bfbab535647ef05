package campaign

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// workNS is the namespace of the workload: triggers, the lookup source,
// children and foreign objects.
const workNS = "campaign"

// ruleFile is the rule the campaign runs at generation gen: every
// ConfigMap labelled campaign=trigger gets a child per name in its
// data.children, holding its data.v, what the lookup source says and the
// rule's generation — unless its data.off is "yes".
func ruleFile(gen int) string {
	return fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: fanout}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: %s, labelSelector: "campaign=trigger"}
  when: "object.?data.?off.orValue('') != 'yes'"
  lookups:
    - id: source
      apiVersion: v1
      kind: ConfigMap
      name: source
  resources:
    - id: child
      forEach: "object.?data.?children.orValue('').split(',').filter(c, c != '')"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-${item}"}
        data:
          v: "${object.?data.?v.orValue('')}"
          src: "${lookups.source == null ? 'none' : lookups.source.?data.?x.orValue('none')}"
          gen: "%d"
  rollout: {strategy: Immediate}
  resyncPeriod: 20s
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: tally}
spec:
  api:
    apiVersion: campaign.syncloop.dev/v1
    kind: Tally
    spec:
      parts: "[]string"
      note: string | default="none"
  resources:
    - id: part
      forEach: "object.spec.?parts.orValue([])"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "tally-${object.metadata.name}-${item}"}
        data: {note: "${object.spec.note}", gen: "%d"}
  status:
    parts: ${size(children.part)}
    note: ${object.spec.note}
  rollout: {strategy: Immediate}
  resyncPeriod: 20s
`, workNS, gen, gen)
}

// tallies are the Tally objects the second rule serves (it defines the
// kind): triggers whose status syncloop writes.
var tallies = schema.GroupVersionResource{Group: "campaign.syncloop.dev", Version: "v1", Resource: "tallies"}

var tallyNames = []string{"y0", "y1", "y2", "y3", "y4", "y5"}

// A broken version of the rule file: it does not load, and the version in
// force stays.
const brokenRule = "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: fanout}\nspec:\n  watch: {apiVersion: v1, kind: ConfigMap\n"

// Names the workload draws from: triggers come and go under the same
// names (a trigger deleted and made again is another object), each wants
// some of the items.
var (
	triggerNames = func() []string {
		out := make([]string, 24)
		for i := range out {
			out[i] = fmt.Sprintf("t%02d", i)
		}
		return out
	}()
	items = []string{"a", "b", "c", "d"}
)

// world is the workload generator and its history: what it wrote, and
// after each change, what the rule then wants (the model: the offline
// renderer over the objects the generator made and the rule in force). It
// talks to the API server directly, never through the fault proxy.
type world struct {
	cs       kubernetes.Interface
	dc       dynamic.Interface
	rng      *rand.Rand
	rulesDir string

	gen      int  // the generation of the rule in force (its last valid version)
	broken   bool // the file holds a broken version now
	triggers map[string]*corev1.ConfigMap
	tallies  map[string]*unstructured.Unstructured
	source   *corev1.ConfigMap
	foreign  map[string]*foreignObject // by name
	drifted  []drift

	history []snapshot
	ops     map[string]int // done, by kind
}

// foreignObject is an object the generator put under a child's name: not
// syncloop's, so never to be written by it while it is there.
type foreignObject struct {
	uid              types.UID
	created, deleted time.Time // deleted zero: still there
}

// drift is a child the generator changed as another writer would.
type drift struct {
	name string
	at   time.Time
}

// snapshot is what the rule wants after one change: the desired children
// by name.
type snapshot struct {
	at      time.Time
	desired map[string]desiredChild
}

type desiredChild struct {
	ownerUID string
	data     map[string]any
}

func newWorld(cs kubernetes.Interface, dc dynamic.Interface, seed uint64, rulesDir string) *world {
	return &world{cs: cs, dc: dc, rng: rand.New(rand.NewPCG(seed^0x5bd1e995, seed)), rulesDir: rulesDir, gen: 1,
		triggers: map[string]*corev1.ConfigMap{}, tallies: map[string]*unstructured.Unstructured{},
		foreign: map[string]*foreignObject{}, ops: map[string]int{}}
}

// setUp writes the rule file and the namespace.
func (w *world) setUp(ctx context.Context) error {
	if _, err := w.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: workNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := w.writeRule(ruleFile(w.gen)); err != nil {
		return err
	}
	return w.record(time.Now())
}

// writeRule replaces the rule file as an editor or a ConfigMap update
// would: a new file renamed over the old.
func (w *world) writeRule(text string) error {
	tmp := filepath.Join(w.rulesDir, ".rules.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(w.rulesDir, "rules.yaml"))
}

// step makes one random change; an error (the API server is down) leaves
// the history as it was.
func (w *world) step(ctx context.Context) error {
	kinds := []struct {
		name   string
		weight int
		do     func(context.Context) error
	}{
		{"create-trigger", 8, w.createTrigger},
		{"update-trigger", 8, w.updateTrigger},
		{"delete-trigger", 4, w.deleteTrigger},
		{"toggle-when", 2, w.toggleWhen},
		{"change-source", 2, w.changeSource},
		{"edit-rule", 1, w.editRule},
		{"break-rule", 1, w.breakRule},
		{"drift-child", 3, w.driftChild},
		{"place-foreign", 2, w.placeForeign},
		{"remove-foreign", 1, w.removeForeign},
		{"change-tally", 4, w.changeTally},
	}
	total := 0
	for _, k := range kinds {
		total += k.weight
	}
	n := w.rng.IntN(total)
	for _, k := range kinds {
		if n -= k.weight; n < 0 {
			// A change may take hold at any time after its request
			// leaves: the history has it from then on.
			start := time.Now()
			if err := k.do(ctx); err != nil {
				return err
			}
			w.ops[k.name]++
			return w.record(start)
		}
	}
	return nil
}

func (w *world) pick(from []string) string { return from[w.rng.IntN(len(from))] }

func (w *world) someItems() string {
	var out []string
	for _, it := range items {
		if w.rng.IntN(2) == 0 {
			out = append(out, it)
		}
	}
	return strings.Join(out, ",")
}

func (w *world) existing() []string {
	out := make([]string, 0, len(w.triggers))
	for name := range w.triggers {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func (w *world) createTrigger(ctx context.Context) error {
	name := w.pick(triggerNames)
	if w.triggers[name] != nil {
		return w.updateTrigger(ctx)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workNS, Labels: map[string]string{"campaign": "trigger"}},
		Data: map[string]string{"children": w.someItems(), "v": fmt.Sprint(w.rng.IntN(1000))}}
	made, err := w.cs.CoreV1().ConfigMaps(workNS).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	w.triggers[name] = made
	return nil
}

func (w *world) updateTrigger(ctx context.Context) error {
	names := w.existing()
	if len(names) == 0 {
		return w.createTrigger(ctx)
	}
	cm := w.triggers[w.pick(names)].DeepCopy()
	if w.rng.IntN(2) == 0 {
		cm.Data["children"] = w.someItems()
	} else {
		cm.Data["v"] = fmt.Sprint(w.rng.IntN(1000))
	}
	return w.update(ctx, cm)
}

func (w *world) update(ctx context.Context, cm *corev1.ConfigMap) error {
	made, err := w.cs.CoreV1().ConfigMaps(workNS).Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	w.triggers[cm.Name] = made
	return nil
}

func (w *world) deleteTrigger(ctx context.Context) error {
	names := w.existing()
	if len(names) == 0 {
		return nil
	}
	name := w.pick(names)
	if err := w.cs.CoreV1().ConfigMaps(workNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	delete(w.triggers, name)
	return nil
}

func (w *world) toggleWhen(ctx context.Context) error {
	names := w.existing()
	if len(names) == 0 {
		return nil
	}
	cm := w.triggers[w.pick(names)].DeepCopy()
	if cm.Data["off"] == "yes" {
		delete(cm.Data, "off")
	} else {
		cm.Data["off"] = "yes"
	}
	return w.update(ctx, cm)
}

func (w *world) changeSource(ctx context.Context) error {
	sources := w.cs.CoreV1().ConfigMaps(workNS)
	switch {
	case w.source == nil:
		made, err := sources.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "source", Namespace: workNS},
			Data: map[string]string{"x": fmt.Sprint("x", w.rng.IntN(100))}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		w.source = made
	case w.rng.IntN(4) == 0:
		if err := sources.Delete(ctx, "source", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		w.source = nil
	default:
		cm := w.source.DeepCopy()
		cm.Data["x"] = fmt.Sprint("x", w.rng.IntN(100))
		made, err := sources.Update(ctx, cm, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		w.source = made
	}
	return nil
}

// editRule puts a new valid generation of the rule in force (fixing a
// broken file, if it was).
func (w *world) editRule(context.Context) error {
	if err := w.writeRule(ruleFile(w.gen + 1)); err != nil {
		return err
	}
	w.gen++
	w.broken = false
	return nil
}

func (w *world) breakRule(ctx context.Context) error {
	if w.broken {
		return w.editRule(ctx)
	}
	if err := w.writeRule(brokenRule); err != nil {
		return err
	}
	w.broken = true
	return nil
}

// driftChild changes a wanted child's data.v, as another controller
// would, with its own field manager.
func (w *world) driftChild(ctx context.Context) error {
	last := w.history[len(w.history)-1]
	names := make([]string, 0, len(last.desired))
	for name := range last.desired {
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	name := w.pick(names)
	cm, err := w.cs.CoreV1().ConfigMaps(workNS).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data["v"] = fmt.Sprint("drift-", w.rng.IntN(1000))
	if _, err := w.cs.CoreV1().ConfigMaps(workNS).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "intruder"}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	w.drifted = append(w.drifted, drift{name: name, at: time.Now()})
	return nil
}

// placeForeign makes an object of someone else's under the name a child
// of a trigger that does not exist yet may get.
func (w *world) placeForeign(ctx context.Context) error {
	trigger := w.pick(triggerNames)
	if w.triggers[trigger] != nil {
		return nil
	}
	name := trigger + "-" + w.pick(items)
	if f := w.foreign[name]; f != nil && f.deleted.IsZero() {
		return nil
	}
	made, err := w.cs.CoreV1().ConfigMaps(workNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: workNS,
		Labels: map[string]string{"owner": "someone-else"}}, Data: map[string]string{"mine": "yes"}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil // a child of a trigger deleted a moment ago, not pruned yet
	}
	if err != nil {
		return err
	}
	w.foreign[name] = &foreignObject{uid: made.UID, created: time.Now()}
	return nil
}

func (w *world) removeForeign(ctx context.Context) error {
	var names []string
	for name, f := range w.foreign {
		if f.deleted.IsZero() {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	name := w.pick(names)
	uid := w.foreign[name].uid
	// Gone, as far as the checks go, from the moment the request leaves:
	// syncloop may make its child a millisecond after.
	start := time.Now()
	if err := w.cs.CoreV1().ConfigMaps(workNS).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
		// Perhaps deleted all the same (an API server stopping meanwhile).
		cm, gerr := w.cs.CoreV1().ConfigMaps(workNS).Get(ctx, name, metav1.GetOptions{})
		if stillThere, unknown := gerr == nil && cm.UID == uid, gerr != nil && !apierrors.IsNotFound(gerr); stillThere || unknown {
			return err
		}
	}
	w.foreign[name].deleted = start
	return nil
}

// changeTally creates, changes or deletes a Tally. Until syncloop has
// made the kind's CRD, it fails as a step does when the API server is
// down.
func (w *world) changeTally(ctx context.Context) error {
	name := w.pick(tallyNames)
	client := w.dc.Resource(tallies).Namespace(workNS)
	t := w.tallies[name]
	if t != nil && w.rng.IntN(3) == 0 {
		if err := client.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		delete(w.tallies, name)
		return nil
	}
	var parts []any
	for _, it := range strings.Split(w.someItems(), ",") {
		if it != "" {
			parts = append(parts, it)
		}
	}
	spec := map[string]any{"parts": parts}
	if w.rng.IntN(2) == 0 {
		spec["note"] = fmt.Sprint("n", w.rng.IntN(100))
	}
	var made *unstructured.Unstructured
	var err error
	if t == nil {
		t = &unstructured.Unstructured{Object: map[string]any{"apiVersion": tallies.GroupVersion().String(), "kind": "Tally",
			"metadata": map[string]any{"name": name, "namespace": workNS}}}
		t.Object["spec"] = spec
		made, err = client.Create(ctx, t, metav1.CreateOptions{})
	} else {
		t = t.DeepCopy()
		t.Object["spec"] = spec
		made, err = client.Update(ctx, t, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) { // its status changed: take the fresh one
			if fresh, gerr := client.Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				fresh.Object["spec"] = spec
				made, err = client.Update(ctx, fresh, metav1.UpdateOptions{})
			}
		}
	}
	if err != nil {
		return err
	}
	w.tallies[name] = made
	return nil
}
