package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// TestSettle: what becomes of a key after its work — the worker step's
// one decision: looked at again later when a gate was closed, forgotten
// when done, terminal or out of retries, otherwise retried with backoff.
func TestSettle(t *testing.T) {
	t.Parallel()
	transient := errors.New("the API server timed out")
	outside := terminal(errors.New(`resource "cm": ConfigMap other/x is outside namespace "ns"`))
	for _, c := range []struct {
		name     string
		after    time.Duration
		err      error
		requeues int // failures before this work, at least 1
		// want: "forget" (the failures forgotten), "kept" (neither
		// forgotten nor retried: looked at again later), or "backoff"
		// (AddRateLimited)
		want string
	}{
		{"succeeded", 0, nil, 1, "forget"},
		{"a gate closed", holdWait, nil, 1, "kept"},
		{"a transient failure", 0, transient, 1, "backoff"},
		{"wrapped transient", 0, fmt.Errorf("rule r: %w", transient), 1, "backoff"},
		{"terminal", 0, outside, 1, "forget"},
		{"terminal, wrapped", 0, fmt.Errorf("rule r: %w", outside), 1, "forget"},
		{"terminal joined with transient", 0, errors.Join(outside, transient), 1, "backoff"},
		{"only terminal joined", 0, errors.Join(outside, outside), 1, "forget"},
		{"out of retries", 0, transient, 2, "forget"}, // MaxRetries 3
	} {
		t.Run(c.name, func(t *testing.T) {
			q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](time.Hour, time.Hour))
			defer q.ShutDown()
			l := &ruleLoop{e: &Engine{}, rule: &rules.Rule{Name: "r", RunOptions: rules.RunOptions{MaxRetries: 3}}, queue: q}
			key := cache.ObjectName{Namespace: "ns", Name: "t"}
			for range c.requeues {
				q.AddRateLimited(key) // counted; due in an hour
			}
			l.settle(klog.Background(), key, c.after, c.err)
			got := "kept"
			switch n := q.NumRequeues(key); {
			case n > c.requeues:
				got = "backoff"
			case n == 0:
				got = "forget"
			}
			if got != c.want {
				t.Errorf("%s after %d retries: %s, want %s", c.err, c.requeues, got, c.want)
			}
		})
	}
}

// TestOutsideNamespaceIsTerminal: a child rendered outside the namespace
// a rule is confined to fails its trigger terminally — no retry mends it
// — and the children inside are still made.
func TestOutsideNamespaceIsTerminal(t *testing.T) {
	t.Parallel()
	u := newUnit(t, `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: out}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS}
  resources:
    - id: inside
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-in"}
    - id: outside
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-out", namespace: elsewhere}
`)
	u.rc.w.ns = "ns" // --watch-namespace ns
	for _, ck := range u.rc.w.children {
		ck.ns = "ns"
	}
	u.triggers().put(obj("ConfigMap", "t", nil, nil))
	writes, err := u.reconcile("t")
	if err == nil || !isTerminal(err) || !strings.Contains(err.Error(), `ConfigMap elsewhere/t-out is outside namespace "ns"`) {
		t.Fatalf("reconcile: %v (terminal %v), want a terminal failure naming the child outside", err, isTerminal(err))
	}
	if !slices.Contains(writes, "create ConfigMap ns/t-in") {
		t.Errorf("writes %q: the child inside the namespace is not made", writes)
	}
}
