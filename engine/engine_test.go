package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// Workloads: Deployments whose Pods become Ready (workloads_test.go);
// it implies the garbage collector, namespace and token controllers.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{Workloads: true}) }

// harness is one test's view of the cluster and a running engine.
type harness struct {
	t         *testing.T
	env       *testenv.Env
	cs        kubernetes.Interface
	ns        string
	counter   *testenv.RequestCounter // requests of the engine only
	engine    *Engine
	updates   chan *rules.Set // rule sets for the running engine
	plan      Planner         // set before start for a dry run
	config    *rest.Config    // the engine's identity, set before start; nil: admin
	metrics   Metrics         // set before start; nil: none
	limitNS   string          // Options.Namespace, set before start
	eventMode EventMode       // Options.Events, set before start
	shard     Shard           // Options.Shard, set before start
	rollouts  RolloutStore    // Options.Rollouts, set before start
	fights    FightPolicy     // Options.Fights, set before start
	fleet     Fleet           // Options.Fleet, set before start
	eventLRU  int             // entries of each of the recorder's Event caches, set before start; 0: client-go's 4,096
	// alone: the test looks at the whole process (its goroutines), or
	// takes its CPU for seconds (hostile triggers), and shares it with no
	// other test; set before start.
	alone bool
	// shared: the harness is on the package's control plane, which the
	// tests share (newHarness), not on one of the test's own.
	shared bool
	// installation the rules loadRules loads act for; "": the default.
	installation string
	stop         func()
	done         chan struct{} // closed when the engine's Run has returned
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarnessOn(t, testenv.Get(t))
	h.shared = true
	return h
}

// newHarnessOn is newHarness on a control plane of the test's own.
func newHarnessOn(t *testing.T, env *testenv.Env) *harness {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "eng-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, env: env, cs: cs, ns: ns.Name, counter: &testenv.RequestCounter{}, updates: make(chan *rules.Set)}
}

// loadRules parses rule YAML in which NS stands for the test's namespace.
func (h *harness) loadRules(yaml string) *rules.Set {
	h.t.Helper()
	return h.loadRulesAt("test.yaml", yaml, nil)
}

// loadRulesAt is loadRules for a rule file at path (its modules beside
// it), with the loader set up by setup (nil: as it comes).
func (h *harness) loadRulesAt(path, yaml string, setup func(*rules.Loader)) *rules.Set {
	h.t.Helper()
	l, err := rules.NewLoader(expr.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := l.SetInstallation(h.installation); err != nil {
		h.t.Fatal(err)
	}
	if setup != nil {
		setup(l)
	}
	f, err := l.Parse(path, []byte(strings.ReplaceAll(yaml, "NS", h.ns)))
	if err != nil {
		h.t.Fatal(err)
	}
	set, err := rules.NewSet(f)
	if err != nil {
		h.t.Fatal(err)
	}
	return set
}

// parallelTests are the tests that have decided, at their first start,
// whether they run in parallel.
var parallelTests sync.Map

// parallel lets the test run beside others on the shared control plane
// when each rule of set is confined to the test's namespace — it watches
// only there, or the engine is limited to it — so that no engine reads or
// writes another test's objects. A rule that watches the whole cluster
// keeps its test to itself. The test decides at its first start, before
// any engine of it runs: one running while the test waits to go parallel
// would share the process with the serial tests.
func (h *harness) parallel(set *rules.Set) {
	if _, decided := parallelTests.LoadOrStore(h.t, true); decided {
		return
	}
	if h.alone || !h.shared {
		return
	}
	for _, r := range set.Rules() {
		if h.limitNS != h.ns && r.Watch.Namespace != h.ns {
			return
		}
	}
	h.t.Parallel()
}

// goParallel lets the test run beside others now, before it starts
// anything of its own that a serial test would find running (an
// inventory, a proxy): for a test whose rules all watch only its
// namespace, as parallel would decide at the first start.
func (h *harness) goParallel() {
	if _, decided := parallelTests.LoadOrStore(h.t, true); !decided {
		h.t.Parallel()
	}
}

// start runs an engine with set until the test ends (or h.stop), and
// waits until it is ready.
func (h *harness) start(set *rules.Set) {
	h.t.Helper()
	h.startWith(set, true)
}

func (h *harness) startWith(set *rules.Set, waitReady bool) {
	h.t.Helper()
	h.parallel(set)
	cfg := h.env.Config()
	if h.config != nil {
		cfg = h.config
	}
	cfg = h.counter.Wrap(cfg)
	cl, err := dynamic.NewClient(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	broadcaster := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: h.eventLRU}))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: h.cs.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "syncloop"})

	h.engine = New(Options{Client: cl, Mapper: dynamic.NewMapper(disco, 200*time.Millisecond), Recorder: recorder, DrainTimeout: 5 * time.Second, Plan: h.plan, Metrics: h.metrics, Namespace: h.limitNS, Events: h.eventMode, Shard: h.shard, Rollouts: h.rollouts, Fights: h.fights, Fleet: h.fleet})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	h.done = done
	go func() {
		defer close(done)
		_ = h.engine.Run(ctx, set, h.updates)
	}()
	stopped := false
	h.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			broadcaster.Shutdown()
		}
	}
	h.t.Cleanup(h.stop)
	if waitReady {
		h.eventually("the engine to be ready", func() bool { return h.engine.Ready() })
	}
}

// loop returns the running loop of a rule.
func (h *harness) loop(name string) *ruleLoop {
	h.engine.set.mu.Lock()
	defer h.engine.set.mu.Unlock()
	l := h.engine.set.loops[name]
	if l == nil {
		h.t.Fatalf("no loop for rule %q", name)
	}
	return l
}

func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	h.eventuallyWithin(30*time.Second, what, cond)
}

// within reports whether cond holds within timeout.
func (h *harness) within(timeout time.Duration, cond func() bool) bool {
	return wait.PollUntilContextTimeout(h.t.Context(), 25*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	}) == nil
}

func (h *harness) eventuallyWithin(timeout time.Duration, what string, cond func() bool) {
	h.t.Helper()
	err := wait.PollUntilContextTimeout(h.t.Context(), 25*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		h.t.Fatalf("timed out waiting for %s", what)
	}
}

func (h *harness) configMap(ns, name string) (*corev1.ConfigMap, bool) {
	cm, err := h.cs.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return cm, true
}

func (h *harness) createCM(name string, labels, data map[string]string) *corev1.ConfigMap {
	h.t.Helper()
	cm, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(context.Background(),
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: data}, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return cm
}

func (h *harness) updateCM(name string, mutate func(*corev1.ConfigMap)) {
	h.t.Helper()
	err := wait.PollUntilContextTimeout(h.t.Context(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		cm, err := h.cs.CoreV1().ConfigMaps(h.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		mutate(cm)
		_, err = h.cs.CoreV1().ConfigMaps(h.ns).Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) events(reason string) []corev1.Event {
	list, err := h.cs.CoreV1().Events(h.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// waitForFailed waits for a Failed Event on the trigger named object whose
// message contains text.
func (h *harness) waitForFailed(object, text string) {
	h.t.Helper()
	h.waitForEventWithin(30*time.Second, "Failed", object, text)
}

// waitForFailedWithin is waitForFailed with its own deadline.
func (h *harness) waitForFailedWithin(timeout time.Duration, object, text string) {
	h.t.Helper()
	h.waitForEventWithin(timeout, "Failed", object, text)
}

// waitForEventWithin waits for an Event with reason on the object named
// object whose message contains text.
func (h *harness) waitForEventWithin(timeout time.Duration, reason, object, text string) {
	h.t.Helper()
	h.eventuallyWithin(timeout, fmt.Sprintf("a %s event on %s saying %q", reason, object, text), func() bool {
		for _, e := range h.events(reason) {
			if e.InvolvedObject.Name == object && strings.Contains(e.Message, text) {
				return true
			}
		}
		return false
	})
}

// copyRule: every ConfigMap labelled copy=yes in NS gets a copy named
// <name>-copy holding its data, and one per team listed in data.teams.
const copyRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: copy}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "copy=yes"}
  when: "object.?data.?skip.orValue('') != 'true'"
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: ${object.?data}
    - id: team
      forEach: "object.?data.?teams.orValue('').split(',').filter(t, t != '')"
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-team-${item}"}
        data: {team: "${item}"}
  resyncPeriod: 1s
`

// TestTriggerLifecycle: a trigger gets its children, server-side applied by
// the rule's field manager with its owner marks; they follow its changes and
// go with it.
//
// API server: server-side apply (managedFields), ownerReferences, label
// selectors and watches through a trigger's life.
func TestTriggerLifecycle(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(copyRule))

	src := h.createCM("src", map[string]string{"copy": "yes"}, map[string]string{"k": "v1", "teams": "a,b"})
	h.createCM("unlabelled", nil, map[string]string{"k": "v"})
	h.eventually("the copy and two team children", func() bool {
		cp, ok := h.configMap(h.ns, "src-copy")
		_, a := h.configMap(h.ns, "src-team-a")
		_, b := h.configMap(h.ns, "src-team-b")
		return ok && cp.Data["k"] == "v1" && a && b
	})
	cp, _ := h.configMap(h.ns, "src-copy")
	if cp.Labels[rules.LabelRule] != "copy" || cp.Labels[rules.LabelOwnerUID] != string(src.UID) ||
		cp.Annotations[rules.AnnotationOwner] != "v1/ConfigMap/"+h.ns+"/src" || len(cp.OwnerReferences) != 1 || cp.OwnerReferences[0].UID != src.UID {
		t.Errorf("child metadata: labels %v annotations %v ownerReferences %v", cp.Labels, cp.Annotations, cp.OwnerReferences)
	}
	found := false
	for _, mf := range cp.ManagedFields {
		found = found || (mf.Manager == "syncloop/copy" && mf.Operation == metav1.ManagedFieldsOperationApply)
	}
	if !found {
		t.Errorf("child not server-side applied by syncloop/copy: %v", cp.ManagedFields)
	}
	if _, ok := h.configMap(h.ns, "unlabelled-copy"); ok {
		t.Error("an object outside the label selector got a child")
	}

	// Update: the copy follows; forEach shrinks (b pruned) and grows (c).
	h.updateCM("src", func(cm *corev1.ConfigMap) { cm.Data["k"] = "v2"; cm.Data["teams"] = "a,c" })
	h.eventually("the copy to follow and the teams to become a,c", func() bool {
		cp, _ := h.configMap(h.ns, "src-copy")
		_, a := h.configMap(h.ns, "src-team-a")
		_, b := h.configMap(h.ns, "src-team-b")
		_, c := h.configMap(h.ns, "src-team-c")
		return cp != nil && cp.Data["k"] == "v2" && a && !b && c
	})

	// `when` turns false: children pruned; true again: back.
	h.updateCM("src", func(cm *corev1.ConfigMap) { cm.Data["skip"] = "true" })
	h.eventually("children pruned when `when` turned false", func() bool {
		_, cp := h.configMap(h.ns, "src-copy")
		_, a := h.configMap(h.ns, "src-team-a")
		return !cp && !a
	})
	h.updateCM("src", func(cm *corev1.ConfigMap) { delete(cm.Data, "skip") })
	h.eventually("children back when `when` turned true", func() bool {
		_, cp := h.configMap(h.ns, "src-copy")
		return cp
	})

	// Leaving the label selector is like being deleted.
	h.updateCM("src", func(cm *corev1.ConfigMap) { cm.Labels["copy"] = "no" })
	h.eventually("children pruned when the trigger left the selector", func() bool {
		_, cp := h.configMap(h.ns, "src-copy")
		return !cp
	})
	h.updateCM("src", func(cm *corev1.ConfigMap) { cm.Labels["copy"] = "yes" })
	h.eventually("children back", func() bool { _, cp := h.configMap(h.ns, "src-copy"); return cp })

	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "src", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("children pruned after the trigger was deleted", func() bool {
		_, cp := h.configMap(h.ns, "src-copy")
		_, a := h.configMap(h.ns, "src-team-a")
		_, c := h.configMap(h.ns, "src-team-c")
		return !cp && !a && !c
	})
}

// TestEventModes: by default (warnings) a successful reconcile writes no
// Event, a failure a Failed one; with EventsAll each reconcile that changed
// something writes one Normal Event naming every child it created, updated
// or deleted.
//
// API server: Events recorded on the trigger, and a write it refuses.
func TestEventModes(t *testing.T) {
	t.Run("warnings", func(t *testing.T) {
		h := newHarness(t)
		h.start(h.loadRules(copyRule))
		h.createCM("ok", map[string]string{"copy": "yes"}, map[string]string{"k": "v", "teams": "a"})
		h.eventually("the children of ok", func() bool { _, ok := h.configMap(h.ns, "ok-team-a"); return ok })
		// Events are sent in order: once the Failed Event of a later
		// reconcile is there, any Event of the earlier ones is too.
		h.createCM("bad", map[string]string{"copy": "yes"}, map[string]string{"teams": "Not_A_Name"})
		h.waitForFailed("bad", "bad-team-Not_A_Name")
		list, err := h.cs.CoreV1().Events(h.ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Type != corev1.EventTypeWarning {
				t.Errorf("a %s Event %s %q was written by default", e.Type, e.Reason, e.Message)
			}
		}
	})
	t.Run("all", func(t *testing.T) {
		h := newHarness(t)
		h.eventMode = EventsAll
		h.start(h.loadRules(copyRule))
		h.createCM("src", map[string]string{"copy": "yes"}, map[string]string{"k": "v", "teams": "a,b"})
		var applied corev1.Event
		h.eventually("one Applied Event naming the three children", func() bool {
			evs := h.events("Applied")
			if len(evs) == 0 {
				return false
			}
			applied = evs[0]
			return true
		})
		for _, want := range []string{"Created ConfigMap " + h.ns + "/src-copy", "Created ConfigMap " + h.ns + "/src-team-a", "Created ConfigMap " + h.ns + "/src-team-b"} {
			if !strings.Contains(applied.Message, want) {
				t.Errorf("Applied Event %q does not say %q", applied.Message, want)
			}
		}
		if applied.Count != 1 || applied.Type != corev1.EventTypeNormal {
			t.Errorf("Applied Event: type %s, count %d; want one Normal Event for the reconcile", applied.Type, applied.Count)
		}
		h.updateCM("src", func(cm *corev1.ConfigMap) { cm.Data["teams"] = "a"; cm.Data["k"] = "w" })
		h.eventually("an Applied Event naming the update and the delete", func() bool {
			for _, e := range h.events("Applied") {
				if strings.Contains(e.Message, "Updated ConfigMap "+h.ns+"/src-copy") && strings.Contains(e.Message, "Deleted ConfigMap "+h.ns+"/src-team-b") {
					return true
				}
			}
			return false
		})
		h.updateCM("src", func(cm *corev1.ConfigMap) { cm.Data["skip"] = "true" })
		h.eventually("a Pruned Event when only deletes happened", func() bool {
			for _, e := range h.events("Pruned") {
				if strings.Contains(e.Message, "Deleted ConfigMap "+h.ns+"/src-copy") && strings.Contains(e.Message, "Deleted ConfigMap "+h.ns+"/src-team-a") {
					return true
				}
			}
			return false
		})
	})
}

// TestDriftRepair: a child another writer edits or deletes is put back.
//
// API server: watch events of another writer's update and delete of a
// child.
func TestDriftRepair(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(copyRule))
	h.createCM("src", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	h.eventually("the copy", func() bool { _, ok := h.configMap(h.ns, "src-copy"); return ok })

	h.updateCM("src-copy", func(cm *corev1.ConfigMap) { cm.Data["k"] = "tampered" })
	h.eventually("an edited child repaired", func() bool {
		cp, _ := h.configMap(h.ns, "src-copy")
		return cp != nil && cp.Data["k"] == "v"
	})
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "src-copy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("a deleted child recreated", func() bool { _, ok := h.configMap(h.ns, "src-copy"); return ok })
}

// TestSteadyStateCostsNothing: once everything is in sync, full resyncs
// (every second here) make no API request at all — no writes, no GETs.
//
// API server: the requests the server sees (counted by the test's request
// filter).
func TestSteadyStateCostsNothing(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(copyRule))
	for i := range 5 {
		h.createCM(fmt.Sprintf("src-%d", i), map[string]string{"copy": "yes"}, map[string]string{"k": "v", "teams": "x,y"})
	}
	h.eventually("15 children", func() bool {
		l, _ := h.cs.CoreV1().ConfigMaps(h.ns).List(context.Background(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=copy"})
		return len(l.Items) == 15
	})
	c := h.loop("copy")
	// quietCycles waits for n resync passes and their 5 reconciles each.
	quietCycles := func(n int64) {
		r0, k0 := c.resyncs.Load(), c.reconciles.Load()
		h.eventually(fmt.Sprintf("%d resync cycles processed", n), func() bool {
			return c.resyncs.Load() >= r0+n && c.reconciles.Load() >= k0+5*n && c.queue.Len() == 0
		})
	}
	// The echoes of our own applies settle within a cycle or two.
	h.eventually("a resync cycle without requests", func() bool {
		h.counter.Reset()
		quietCycles(1)
		return len(h.counter.Requests(nil)) == 0
	})
	h.counter.Reset()
	quietCycles(3)
	var writes, gets []string
	for _, r := range h.counter.Requests(nil) {
		switch {
		case r.IsWrite():
			writes = append(writes, r.Method+" "+r.Path)
		case r.Verb() == "get":
			gets = append(gets, r.Method+" "+r.Path+"?"+r.Query)
		}
	}
	if len(writes) != 0 || len(gets) != 0 {
		t.Errorf("in steady state over 3 resyncs: %d writes %v, %d GETs %v; want none", len(writes), writes, len(gets), gets)
	}
}
