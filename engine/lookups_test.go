package engine

import (
	"context"
	"encoding/base64"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// pullRule copies the Secret "source" of the test's namespace for every
// ConfigMap labelled pull=yes, while the source exists. No resync: every
// change must arrive through the lookup's watch.
const pullRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: pull}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "pull=yes"}
  lookups:
    - id: source
      apiVersion: v1
      kind: Secret
      namespace: NS
      name: source
  resources:
    - id: copy
      when: lookups.source != null
      template:
        apiVersion: v1
        kind: Secret
        metadata: {name: "${object.metadata.name}-pull"}
        type: ${lookups.source.type}
        data: ${lookups.source.?data.orValue({})}
  resyncPeriod: "0"
`

func (h *harness) secret(name string) (*corev1.Secret, bool) {
	h.t.Helper()
	s, err := h.cs.CoreV1().Secrets(h.ns).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return s, true
}

// copies counts the Secrets named <trigger>-pull whose data has k=v.
func (h *harness) copies(k, v string) int {
	h.t.Helper()
	l, err := h.cs.CoreV1().Secrets(h.ns).List(context.Background(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=pull"})
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	for _, s := range l.Items {
		if string(s.Data[k]) == v {
			n++
		}
	}
	return n
}

// TestLookupSource: a source created after its triggers is copied to all of
// them; a change of the source reaches 200 triggers without a resync; a
// key removed from the source leaves the copies; the source deleted prunes
// them. At steady state the rule reads and writes nothing.
//
// API server: watches of a lookup source delivering its changes.
func TestLookupSource(t *testing.T) {
	const n = 200
	h := newHarness(t)
	h.start(h.loadRules(pullRule))
	c := h.loop("pull")
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("t%03d", i)
	}
	parallel(t, names, func(ctx context.Context, name string) error {
		_, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pull": "yes"}}}, metav1.CreateOptions{})
		return err
	})
	h.eventually("every trigger reconciled, reading the absent source", func() bool { return c.rc.deps.len() == n && c.idle() })
	if got := h.copies("k", "1"); got != 0 {
		t.Fatalf("%d copies before the source exists", got)
	}

	// Created late: picked up at once, not at a resync (there is none).
	src, err := h.cs.CoreV1().Secrets(h.ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "source"}, Data: map[string][]byte{"k": []byte("1"), "gone": []byte("x")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.eventually(fmt.Sprintf("%d copies of the late source", n), func() bool { return h.copies("k", "1") == n })

	// Changed, with a key removed: all 200 copies follow, the key goes.
	src.Data = map[string][]byte{"k": []byte("2")}
	if _, err := h.cs.CoreV1().Secrets(h.ns).Update(context.Background(), src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(fmt.Sprintf("%d copies of the changed source", n), func() bool { return h.copies("k", "2") == n })
	if got := h.copies("gone", "x"); got != 0 {
		t.Errorf("%d copies still hold the key removed from the source", got)
	}
	if c.resyncs.Load() != 0 {
		t.Fatalf("%d resyncs ran; the test means to show the watch alone carries the change", c.resyncs.Load())
	}

	// Steady state: nothing read, nothing written (once the cache holds
	// the echo of every apply).
	h.eventually("the queue drained and the cache up to date", func() bool {
		for _, o := range c.cachedChildren(h.ns) {
			if d, _, _ := unstructured.NestedString(wholeOf(o).Object, "data", "k"); d != "Mg==" {
				return false
			}
		}
		return c.idle()
	})
	h.counter.Reset()
	for _, name := range names[:20] { // as a resync would
		c.queue.Add(cache.ObjectName{Namespace: h.ns, Name: name})
	}
	h.eventually("20 triggers reconciled again", func() bool { return c.idle() })
	if reqs := h.counter.Requests(nil); len(reqs) != 0 {
		t.Errorf("reconciles at steady state made %d requests, want none: %v", len(reqs), reqs)
	}

	// Deleted: the copies are pruned, the triggers stay.
	if err := h.cs.CoreV1().Secrets(h.ns).Delete(context.Background(), "source", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the copies pruned", func() bool { return h.copies("k", "2") == 0 })
	if _, ok := h.configMap(h.ns, names[0]); !ok {
		t.Error("a trigger went with the source")
	}
	// Triggers deleted: the index forgets them.
	parallel(t, names, func(ctx context.Context, name string) error {
		return h.cs.CoreV1().ConfigMaps(h.ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
	h.eventually("the lookup index empty", func() bool { return c.rc.deps.len() == 0 })
}

// teamRule gives every ConfigMap labelled kind=team a child listing the
// members of its team: the ConfigMaps labelled member-of=<its name>.
const teamRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: team}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "kind=team"}
  lookups:
    - id: members
      apiVersion: v1
      kind: ConfigMap
      namespace: NS
      labelSelector: "member-of=${object.metadata.name}"
  resources:
    - id: roster
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-roster"}
        data:
          members: "${lookups.members.map(m, m.metadata.name).join(',')}"
  resyncPeriod: "0"
`

// TestLookupList: a list lookup with a templated selector grows, shrinks
// and moves between triggers as labels change, through the watch alone.
//
// API server: label selectors evaluated by the server as labels change.
func TestLookupList(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(teamRule))
	roster := func(team string) string {
		cm, ok := h.configMap(h.ns, team+"-roster")
		if !ok {
			return "<none>"
		}
		return cm.Data["members"]
	}
	wait := func(want map[string]string) {
		t.Helper()
		h.eventually(fmt.Sprintf("rosters %v", want), func() bool {
			for team, members := range want {
				if roster(team) != members {
					return false
				}
			}
			return true
		})
	}
	member := func(name, team string) {
		h.createCM(name, map[string]string{"member-of": team}, nil)
	}
	h.createCM("red", map[string]string{"kind": "team"}, nil)
	h.createCM("blue", map[string]string{"kind": "team"}, nil)
	wait(map[string]string{"red": "", "blue": ""}) // a selector matching nothing: an empty list

	member("bob", "red")
	member("al", "red") // grows, sorted by name
	wait(map[string]string{"red": "al,bob", "blue": ""})

	h.updateCM("bob", func(cm *corev1.ConfigMap) { cm.Labels["member-of"] = "blue" }) // moves
	wait(map[string]string{"red": "al", "blue": "bob"})

	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(context.Background(), "al", metav1.DeleteOptions{}); err != nil { // shrinks
		t.Fatal(err)
	}
	wait(map[string]string{"red": "", "blue": "bob"})

	h.updateCM("bob", func(cm *corev1.ConfigMap) { delete(cm.Labels, "member-of") }) // leaves every team
	wait(map[string]string{"red": "", "blue": ""})
	if n := h.loop("team").resyncs.Load(); n != 0 {
		t.Fatalf("%d resyncs ran", n)
	}
}

// TestLookupWatchKeys: what is literal in a lookup is sent to the API
// server — a namespace, a selector, a name as a field selector — so the
// cache holds what the rule reads and no more; a templated part is not.
//
// API server: namespace, label and field selectors sent to the server.
func TestLookupWatchKeys(t *testing.T) {
	h := newHarness(t)
	h.start(h.loadRules(pullRule + "---\n" + teamRule))
	var keys []string
	for _, k := range h.engine.actors.keys() {
		keys = append(keys, k.String())
	}
	sort.Strings(keys)
	want := []string{
		"configmaps/v1 in " + h.ns,                                                       // team's members: the selector is templated
		"configmaps/v1 in " + h.ns + " labels kind=team",                                 // triggers
		"configmaps/v1 in " + h.ns + " labels pull=yes",                                  // triggers
		"configmaps/v1 labels " + childrenSelector("") + "," + rules.LabelRule + "=team", // team's children
		"secrets/v1 in " + h.ns + " fields metadata.name=source",                         // pull's source: by name
		"secrets/v1 labels " + childrenSelector("") + "," + rules.LabelRule + "=pull",    // pull's children
	}
	if strings.Join(keys, "\n") != strings.Join(want, "\n") {
		t.Errorf("lookup watches:\n%s\nwant:\n%s", strings.Join(keys, "\n"), strings.Join(want, "\n"))
	}
}

// TestLookupKindNotServed: a rule whose lookup kind is not served waits,
// as for a watched kind, and runs once it is.
//
// API server: discovery of a lookup kind installed while running.
func TestLookupKindNotServed(t *testing.T) {
	h := newHarness(t)
	h.startUnready(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: late}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "late=yes"}
  lookups:
    - {id: d, apiVersion: test.syncloop.dev/v1, kind: Doodad, name: d}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-late"}
        data: {found: "${string(lookups.d != null)}"}
`))
	h.eventually("the rule to report that it waits for Doodad", func() bool {
		st := h.engine.States()
		return len(st) == 1 && st[0].State == StateWaiting && strings.Contains(st[0].Detail, "Doodad")
	})
	h.createCM("x", map[string]string{"late": "yes"}, nil)
	if h.engine.Ready() {
		t.Fatal("the engine is ready while a rule waits for its lookup kind")
	}
	if _, err := h.env.InstallCRDs(t.Context(), filepath.Join("testdata", "doodads-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	h.eventually("the child rendered with the lookup absent", func() bool {
		cm, ok := h.configMap(h.ns, "x-late")
		return ok && cm.Data["found"] == "false"
	})
	d := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.syncloop.dev/v1", "kind": "Doodad", "metadata": map[string]any{"name": "d"},
	}}
	doodads := schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "doodads"}
	if _, err := h.dynamic().Resource(doodads).Namespace(h.ns).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the child seeing the Doodad", func() bool {
		cm, ok := h.configMap(h.ns, "x-late")
		return ok && cm.Data["found"] == "true"
	})
}

// TestLookupDryRun: a dry run resolves lookups from the caches too, and
// plans the source's values into the copy — redacted, as for every Secret.
//
// API server: server-side dry-run requests, and Secrets as the server
// returns them.
func TestLookupDryRun(t *testing.T) {
	h := newHarness(t)
	planner := &recordingPlanner{}
	h.plan = planner
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "source"}, Data: map[string][]byte{"token": []byte("new-secret-value")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A copy syncloop made earlier, from an older source.
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "a-pull", Labels: map[string]string{rules.LabelManagedBy: rules.ManagedByValue, rules.LabelRule: "pull"},
			Annotations: map[string]string{rules.AnnotationOwner: "v1/ConfigMap/" + h.ns + "/a"}},
		Data: map[string][]byte{"token": []byte("old-secret-value")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.createCM("a", map[string]string{"pull": "yes"}, nil)
	h.start(h.loadRules(pullRule))
	// A dry run plans again whenever the trigger is reconciled again (the
	// source's arrival may queue it a second time): every plan is the same.
	h.eventually("a planned update of the copy", func() bool { return planner.count(ActionUpdate) >= 1 })
	planner.mu.Lock()
	defer planner.mu.Unlock()
	for _, a := range planner.actions {
		if a.Action != ActionUpdate || a.Object.Name != "a-pull" || !strings.Contains(a.Diff, "token: (redacted") {
			t.Errorf("planned %+v; want the copy's update with its token redacted", a)
		}
		for _, v := range []string{"secret-value", base64.StdEncoding.EncodeToString([]byte("new-secret-value")), base64.StdEncoding.EncodeToString([]byte("old-secret-value"))} {
			if strings.Contains(a.Diff, v) {
				t.Errorf("the plan shows a Secret value (%s):\n%s", v, a.Diff)
			}
		}
	}
	if s, _ := h.secret("a-pull"); string(s.Data["token"]) != "old-secret-value" {
		t.Error("a dry run changed the copy")
	}
}

// TestChainedLookups: a lookup's selector reads another lookup (a
// ConfigMap says which Secrets to list). A change to the first re-queues
// the triggers that read it and the second then selects anew; the index
// stays exact: a Secret only the old selector matched queues nothing.
//
// API server: selectors evaluated by the server, chained through watches.
func TestChainedLookups(t *testing.T) {
	h := newHarness(t)
	settings := h.createCM("settings", nil, map[string]string{"selector": "team=a"})
	for _, s := range []struct{ name, team string }{{"s1", "a"}, {"s2", "a"}, {"s3", "b"}} {
		if _, err := h.cs.CoreV1().Secrets(h.ns).Create(t.Context(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Labels: map[string]string{"team": s.team}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: chain}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "chain=yes"}
  lookups:
    - id: peers
      apiVersion: v1
      kind: Secret
      namespace: NS
      labelSelector: "${lookups.settings.data.selector}"
    - {id: settings, apiVersion: v1, kind: ConfigMap, namespace: NS, name: settings, required: true}
  resources:
    - id: peers
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-peers"}
        data: {names: "${lookups.peers.map(s, s.metadata.name).join(',')}"}
  resyncPeriod: "0"
`))
	h.createCM("t", map[string]string{"chain": "yes"}, nil)
	names := func(want string) func() bool {
		return func() bool { cm, ok := h.configMap(h.ns, "t-peers"); return ok && cm.Data["names"] == want }
	}
	h.eventually("the peers the settings select", names("s1,s2"))
	h.updateCM(settings.Name, func(cm *corev1.ConfigMap) { cm.Data["selector"] = "team=b" })
	h.eventually("the peers the changed settings select", names("s3"))
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s4", Labels: map[string]string{"team": "b"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("a new peer the second lookup selects", names("s3,s4"))
	c := h.loop("chain")
	var queued []cache.ObjectName
	c.rc.deps.each(0, h.ns, "s9", labels.Set{"team": "a"}, func(k cache.ObjectName) { queued = append(queued, k) })
	if len(queued) > 0 {
		t.Errorf("a Secret only the old selector matches would queue %v", queued)
	}
	queued = nil
	c.rc.deps.each(0, h.ns, "s9", labels.Set{"team": "b"}, func(k cache.ObjectName) { queued = append(queued, k) })
	if len(queued) != 1 {
		t.Errorf("a Secret the selector matches queues %v, want the trigger", queued)
	}
}

// TestRequiredLookup: while a required lookup's object is absent, the
// resources that read it wait — not applied, and a child they made
// earlier is not pruned — the others are applied, and Ready is False with
// WaitingForLookup<Id>; once it is back, Ready is True again.
//
// API server: watches delivering a lookup object's creation.
func TestRequiredLookup(t *testing.T) {
	h := newHarness(t)
	h.installWidgets()
	m := &recordingMetrics{}
	h.metrics = m
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: needs-db}
spec:
  watch: {apiVersion: test.syncloop.dev/v1, kind: Widget, namespace: NS}
  lookups:
    - {id: database, apiVersion: v1, kind: ConfigMap, namespace: NS, name: db, required: true}
  variables:
    - {name: host, expression: "lookups.database.data.host"}
  resources:
    - id: conn
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-conn"}
        data: {host: "${variables.host}"}
    - id: other
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-other"}
  status:
    host: "${variables.host}"
  resyncPeriod: "0"
`))
	h.createWidget("w", map[string]any{"size": int64(1)})
	reason := func(want string) func() bool {
		return func() bool { c := readyCondition(h.widget("w")); return c != nil && c["reason"] == want }
	}
	h.eventually("Ready False, WaitingForLookupDatabase", reason(render.ReasonWaitingForLookup+"Database"))
	h.eventually("the resource that does not read the lookup applied", func() bool { _, ok := h.configMap(h.ns, "w-other"); return ok })
	if _, ok := h.configMap(h.ns, "w-conn"); ok {
		t.Error("the resource that reads the absent lookup was applied")
	}
	if c := readyCondition(h.widget("w")); !strings.Contains(c["message"].(string), `lookup "database" is required: ConfigMap `+h.ns+`/db does not exist`) {
		t.Errorf("Ready message %q", c["message"])
	}
	if m.written("needs-db", "wait") == 0 {
		t.Error(`syncloop_apply_total{action="wait"} not counted`)
	}

	db := h.createCM("db", nil, map[string]string{"host": "db.example"})
	h.eventually("the child and the status once the lookup's object exists", func() bool {
		cm, ok := h.configMap(h.ns, "w-conn")
		host, _, _ := unstructured.NestedString(h.widget("w").Object, "status", "host")
		return ok && cm.Data["host"] == "db.example" && host == "db.example" && reason(render.ReasonAllResourcesReady)()
	})
	conn, _ := h.configMap(h.ns, "w-conn")

	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(t.Context(), db.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("Ready False again", reason(render.ReasonWaitingForLookup+"Database"))
	c := h.loop("needs-db")
	h.eventually("idle", c.idle)
	if cm, ok := h.configMap(h.ns, "w-conn"); !ok || cm.UID != conn.UID {
		t.Error("the waiting resource's child was pruned or replaced")
	}
	if host, _, _ := unstructured.NestedString(h.widget("w").Object, "status", "host"); host != "db.example" {
		t.Errorf("the status field that reads the lookup is %q; want it kept while it waits", host)
	}
}

// parallel runs f for every name, twenty at a time.
func parallel(t *testing.T, names []string, f func(context.Context, string) error) {
	t.Helper()
	var wg sync.WaitGroup
	work := make(chan string)
	errs := make(chan error, len(names))
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range work {
				if err := f(t.Context(), name); err != nil {
					errs <- err
				}
			}
		}()
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// cachedChildren lists the rule's children in namespace ns in its cache
// (other tests leave children of same-named rules elsewhere).
func (c *ruleLoop) cachedChildren(ns string) []any {
	var out []any
	for _, ck := range c.watches.children {
		objs, _ := ck.sub.Indexer().ByIndex(cache.NamespaceIndex, ns)
		for _, o := range objs {
			if o.(object).GetLabels()[rules.LabelRule] == c.rule.Name {
				out = append(out, o)
			}
		}
	}
	return out
}
