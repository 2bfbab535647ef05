package engine

import (
	"fmt"
	"sort"
	"strings"
	"testing"

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
	case segs[0] == "api" && len(segs) <= 2, segs[0] == "apis" && len(segs) <= 3:
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
	c := h.controller("copy")
	h.eventually("the queue to drain", func() bool { return c.queue.Len() == 0 })
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
	resync := countByKind(h.counter.Requests(nil))
	t.Logf("one full resync, %d triggers in sync: %d requests %s", n, len(h.counter.Requests(nil)), format(resync))
	if total := len(h.counter.Requests(nil)); total != 0 {
		t.Errorf("a resync with everything in sync made %d requests (%s), want 0", total, format(resync))
	}
}
