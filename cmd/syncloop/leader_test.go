package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := testenv.FreeAddress()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func httpGet(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// replica is one `syncloop run --leader-elect` running in-process.
type replica struct {
	metrics, probes string
	cancel          context.CancelFunc
	exited          chan struct{} // closed once run has returned, with code
	code            int
}

func startReplica(t *testing.T, env *testenv.Env, rulesPath, ns, identity string) *replica {
	r := &replica{metrics: freeAddr(t), probes: freeAddr(t), exited: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.exited)
		r.code = runContext(ctx, []string{"run", "-f", rulesPath, "--kubeconfig", env.Kubeconfig(),
			"--leader-elect", "--leader-elect-namespace", ns, "--leader-elect-id", "syncloop-test", "--leader-elect-identity", identity,
			"--metrics-bind-address", r.metrics, "--health-probe-bind-address", r.probes}, io.Discard, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.exited:
		case <-time.After(30 * time.Second):
		}
	})
	return r
}

// reconciles is the replica's syncloop_reconcile_total, summed.
func (r *replica) reconciles() int {
	n := 0
	for _, l := range counted(httpGet("http://"+r.metrics+"/metrics"), "syncloop_reconcile_total{") {
		_, v, _ := strings.Cut(l, "} ")
		c, _ := strconv.Atoi(v)
		n += c
	}
	return n
}

// counted are the lines of the series of a /metrics body that start
// with prefix and have counted something: a rule's series are there at
// 0 from the start.
func counted(body, prefix string) []string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) && !strings.HasSuffix(l, "} 0") {
			out = append(out, l)
		}
	}
	return out
}

func TestLeaderElection(t *testing.T) {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	created, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "le-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := created.Name
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	// And a rule that defines a kind: only the leader writes its CRD.
	kind := strings.NewReplacer("apimode.syncloop.dev", "leader.syncloop.dev", "name: widget", "name: widget-"+ns, "{{FIELDS}}\n", "").Replace(widgetRule)
	if err := os.WriteFile(rulesPath, []byte(strings.ReplaceAll(strings.SplitN(planRules, "---", 2)[0], "plan-test", ns)+"---\n"+kind), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dc, _ := k8sdynamic.NewForConfig(env.Config())
		_ = dc.Resource(crdGVR).Delete(context.Background(), "widgets.leader.syncloop.dev", metav1.DeleteOptions{})
	})
	poll := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 45*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	holder := func() string {
		l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "syncloop-test", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	trigger := func(name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"plan": "yes"}}, Data: map[string]string{"k": "v"}}
		if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	child := func(name string) bool {
		_, err := cs.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
		return err == nil
	}

	a := startReplica(t, env, rulesPath, ns, "replica-a")
	poll("replica-a to hold the Lease", func() bool { return holder() == "replica-a" })
	b := startReplica(t, env, rulesPath, ns, "replica-b")
	poll("replica-b to report standby", func() bool {
		return strings.Contains(httpGet("http://"+b.probes+"/readyz"), "standby")
	})

	trigger("one")
	poll("the leader to reconcile", func() bool { return child("one-copy") && a.reconciles() > 0 })
	if n := b.reconciles(); n != 0 {
		t.Errorf("the standby reconciled (syncloop_reconcile_total: %d)", n)
	}
	crdApplies := func(r *replica) string {
		return strings.Join(counted(httpGet("http://"+r.metrics+"/metrics"), "syncloop_crd_apply_total{"), "\n")
	}
	if got := crdApplies(a); !strings.Contains(got, `result="created"`) || strings.Count(got, "\n") > 0 {
		t.Errorf("the leader's CRD applies: %q", got)
	}
	if got := crdApplies(b); got != "" {
		t.Errorf("the standby applied a CRD: %q", got)
	}

	// The leader stops cleanly: it drains, releases the Lease, exits 0.
	a.cancel()
	select {
	case <-a.exited:
		if a.code != 0 {
			t.Errorf("the leader exited %d on stop, want 0", a.code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the leader did not stop")
	}
	poll("replica-b to take over the Lease", func() bool { return holder() == "replica-b" })
	trigger("two")
	poll("the new leader to reconcile", func() bool { return child("two-copy") && b.reconciles() > 0 })
	if got := crdApplies(b); got != "" {
		t.Errorf("the new leader applied the CRD it found as its rule defines it: %q", got)
	}
	if !strings.Contains(httpGet("http://"+b.probes+"/readyz"), "rule copy: running") {
		t.Errorf("the new leader's /readyz does not list its rule running")
	}
}
