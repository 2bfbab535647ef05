package engine

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// classify names a request: discovery, list, get (one object), watch, or a
// write verb.
func classify(r testenv.Request) string {
	if r.Method != "GET" {
		return r.Verb()
	}
	if r.Watch {
		return "watch"
	}
	segs := strings.Split(strings.Trim(r.Path, "/"), "/")
	switch {
	case segs[0] == "api" && len(segs) <= 2, segs[0] == "apis" && len(segs) <= 3,
		segs[0] != "api" && segs[0] != "apis": // /version, /openapi/...
		return "discovery"
	}
	// /api/v1/[namespaces/NS/]RESOURCE[/NAME]; /apis/G/V/[namespaces/NS/]RESOURCE[/NAME]
	rest := segs[2:]
	if segs[0] == "apis" {
		rest = segs[3:]
	}
	if len(rest) >= 2 && rest[0] == "namespaces" && len(rest) != 2 {
		rest = rest[2:]
	}
	if len(rest) == 1 {
		return "list"
	}
	return "get"
}

func countByKind(reqs []testenv.Request) map[string]int {
	out := map[string]int{}
	for _, r := range reqs {
		out[classify(r)]++
	}
	return out
}

func format(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// TestRequestCounts: 100 triggers from a cold start cost one apply per
// child and no GET of any object; a full resync afterwards costs nothing.
//
// API server: the requests the server sees (counted by the test's request
// filter).
func TestRequestCounts(t *testing.T) {
	const n = 100
	h := newHarness(t)
	for i := range n {
		h.createCM(fmt.Sprintf("t-%03d", i), map[string]string{"copy": "yes"}, map[string]string{"k": "v"})
	}
	h.start(h.loadRules(strings.Replace(copyRule, "resyncPeriod: 1s", "resyncPeriod: 2s", 1)))
	h.eventually("100 children", func() bool {
		l, _ := h.cs.CoreV1().ConfigMaps(h.ns).List(t.Context(), metav1.ListOptions{LabelSelector: rules.LabelRule + "=copy"})
		return len(l.Items) == n
	})
	c := h.loop("copy")
	// idle, not only an empty queue: a reconcile still in flight may have
	// an apply whose answer (and its count) is on its way.
	h.eventually("the rule idle", c.idle)
	cold := countByKind(h.counter.Requests(nil))
	t.Logf("cold start, %d triggers: %s", n, format(cold))
	if cold["patch"] != n {
		t.Errorf("cold start made %d applies for %d children, want exactly %d", cold["patch"], n, n)
	}
	if cold["get"] != 0 {
		t.Errorf("cold start made %d GETs of single objects, want 0 (everything comes from caches)", cold["get"])
	}

	h.counter.Reset()
	r0, k0 := c.resyncs.Load(), c.reconciles.Load()
	h.eventually("one full resync processed", func() bool {
		return c.resyncs.Load() >= r0+1 && c.reconciles.Load() >= k0+n && c.queue.Len() == 0
	})
	// A watch the API server closed (a slow watcher under load) is resumed
	// by client-go from the last resourceVersion it saw: the server's doing,
	// not the resync's, and no list. A relist would still count.
	resync := h.counter.Requests(func(r testenv.Request) bool { return !resumedWatch(r) })
	t.Logf("one full resync, %d triggers in sync: %d requests %s (watches resumed: %d)",
		n, len(resync), format(countByKind(resync)), len(h.counter.Requests(resumedWatch)))
	if len(resync) != 0 {
		t.Errorf("a resync with everything in sync made %d requests (%s), want 0", len(resync), format(countByKind(resync)))
	}
}

// resumedWatch reports whether r is a watch that resumes from a
// resourceVersion without listing again (no sendInitialEvents).
func resumedWatch(r testenv.Request) bool {
	if !r.Watch {
		return false
	}
	q, err := url.ParseQuery(r.Query)
	if err != nil {
		return false
	}
	rv := q.Get("resourceVersion")
	return q.Get("sendInitialEvents") != "true" && rv != "" && rv != "0"
}

// TestRestartWritesNothing: syncloop restarted over 200 triggers whose
// children are in sync makes no API write and no GET. Workers start once
// the children's cache has synced, while the triggers may still be
// listing; children's events then queue triggers that have not arrived.
// To hold that window open, the restarted engine may not list the
// triggers (Secrets) at first: its reconciles of the queued triggers must
// not take them for deleted and prune their children. Once it may, it
// syncs and still writes nothing.
//
// API server: the requests the server sees when a restarted syncloop lists
// everything.
func TestRestartWritesNothing(t *testing.T) {
	const n = 200
	h := newHarness(t)
	ctx := t.Context()
	for i := range n {
		if _, err := h.cs.CoreV1().Secrets(h.ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t-%03d", i), Labels: map[string]string{"copy": "yes"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set := h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: copy}
spec:
  watch: {apiVersion: v1, kind: Secret, namespace: NS, labelSelector: copy}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: {from: "${object.metadata.name}"}
  resyncPeriod: 1h
`)
	h.start(set)
	children := func() int {
		l, _ := h.cs.CoreV1().ConfigMaps(h.ns).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=copy"})
		return len(l.Items)
	}
	h.eventually("200 children", func() bool { return children() == n })
	h.stop()

	// The restarted engine may manage ConfigMaps, not yet list Secrets.
	user := "restart-" + h.ns
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "syncloop"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch", "patch", "delete"}},
	}}
	roles := h.cs.RbacV1().Roles(h.ns)
	if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cs.RbacV1().RoleBindings(h.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "syncloop"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "syncloop"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.config = h.env.ImpersonatedConfig(user, "system:authenticated")
	h.limitNS = h.ns // a Role: the engine stays in the namespace
	h.counter.Reset()
	h.startWith(set, false)
	h.eventually("the rule's loop", func() bool { return len(h.engine.States()) == 1 })
	c := h.loop("copy")
	h.eventually("the children's events reconciled while the triggers cannot list", func() bool {
		return c.reconciles.Load() >= n && c.idle()
	})
	if c.watches.trigger.HasSynced() {
		t.Fatal("the triggers synced although Secrets may not be listed: the test does not hold the window open")
	}
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}})
	if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the rule running once Secrets may be listed", func() bool { return h.engine.Ready() && c.idle() })
	got := countByKind(h.counter.Requests(func(r testenv.Request) bool { return r.Status < 400 || r.IsWrite() }))
	t.Logf("restart over %d triggers in sync: %s", n, format(got))
	for _, verb := range []string{"patch", "delete", "create", "update", "get"} {
		if got[verb] != 0 {
			t.Errorf("the restart made %d %s requests, want none", got[verb], verb)
		}
	}
	if children() != n {
		t.Errorf("%d children after the restart, want %d", children(), n)
	}
}
