//go:build robustness

// The outage tests stop API servers for seconds: they run in
// `make robustness`, not in the default suite.

package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// ownControlPlane starts a control plane for one test that breaks it.
func ownControlPlane(t *testing.T, apiServerArgs ...string) *testenv.Env {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs the local control plane (run without -short)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env, err := testenv.Start(ctx, testenv.Options{APIServerArgs: apiServerArgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Stop)
	return env
}

// TestAPIServerRestart: kube-apiserver stops for 10 s while syncloop runs,
// and meanwhile triggers change through another API server of the same
// etcd. syncloop keeps running; once its server is back its informers
// catch up and the changes converge; the child of a trigger that did not
// change is never deleted.
//
// API server: kube-apiserver stopping and a second API server on the same
// etcd.
func TestAPIServerRestart(t *testing.T) {
	t.Parallel()
	outage(t, ownControlPlane(t), false)
}

// TestWatchExpiry: the same outage against an API server without a watch
// cache whose etcd is compacted every second, with objects churned while
// syncloop is cut off: its watches resume from a compacted revision, get
// 410 Gone, and relist. No update is missed and nothing is pruned that
// should stay.
//
// API server: etcd compaction expiring watches (410 Gone) with no watch
// cache.
func TestWatchExpiry(t *testing.T) {
	t.Parallel()
	outage(t, ownControlPlane(t, "--watch-cache=false", "--etcd-compaction-interval=1s"), true)
}

func outage(t *testing.T, env *testenv.Env, compacted bool) {
	const downtime = 10 * time.Second
	h := newHarnessOn(t, env)
	yes := map[string]string{"copy": "yes"}
	h.createCM("keep", yes, map[string]string{"k": "v"})
	h.createCM("change", yes, map[string]string{"k": "1"})
	h.createCM("gone", yes, map[string]string{"k": "v"})
	h.start(h.loadRules(copyRule))
	h.eventually("the children", func() bool {
		_, a := h.configMap(h.ns, "keep-copy")
		_, b := h.configMap(h.ns, "change-copy")
		_, c := h.configMap(h.ns, "gone-copy")
		return a && b && c
	})
	keep, _ := h.configMap(h.ns, "keep-copy")

	cfg2, stop2, err := env.AddAPIServer(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	cs2, err := kubernetes.NewForConfig(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	cms := cs2.CoreV1().ConfigMaps(h.ns)

	env.StopAPIServer()
	down := time.Now()
	before := len(h.counter.Requests(nil))
	ctx := t.Context()
	if _, err := cms.Patch(ctx, "change", types.MergePatchType, []byte(`{"data":{"k":"2"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cms.Delete(ctx, "gone", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new", Labels: yes}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if compacted {
		churnUntilCompacted(t, cms)
	}
	// The outage itself: syncloop must ride it out, not exit.
	select {
	case <-time.After(time.Until(down.Add(downtime))):
	case <-h.done:
		t.Fatal("the engine stopped while the API server was down")
	}
	if err := env.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}

	deadline := 90 * time.Second // the reflectors' backoff reaches 30 s
	h.eventuallyWithin(deadline, "the changes made during the outage to converge", func() bool {
		c, ok := h.configMap(h.ns, "change-copy")
		_, gone := h.configMap(h.ns, "gone-copy")
		_, added := h.configMap(h.ns, "new-copy")
		return ok && c.Data["k"] == "2" && !gone && added
	})
	if k, ok := h.configMap(h.ns, "keep-copy"); !ok || k.UID != keep.UID {
		t.Errorf("keep-copy was replaced or deleted during the outage")
	}
	// Both informers (triggers, children) resume from a revision the
	// server no longer has and must relist.
	relisted := func(selector string) bool {
		for _, r := range h.counter.Requests(nil)[before:] {
			if r.Status == 200 && strings.Contains(r.Query, selector) &&
				(classify(r) == "list" || strings.Contains(r.Query, "sendInitialEvents=true")) {
				return true
			}
		}
		return false
	}
	h.eventuallyWithin(deadline, "both informers to relist", func() bool {
		return relisted("labelSelector=copy%3Dyes") && relisted("managed-by%3Dsyncloop")
	})
	for _, r := range h.counter.Requests(nil)[before:] {
		if r.Method == "DELETE" && !strings.HasSuffix(r.Path, "/gone-copy") {
			t.Errorf("deleted something that should stay: %s", r.Path)
		}
	}
	// After the relist drift is still repaired: the child informer works.
	if err := h.cs.CoreV1().ConfigMaps(h.ns).Delete(ctx, "keep-copy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventuallyWithin(deadline, "keep-copy to be recreated", func() bool {
		k, ok := h.configMap(h.ns, "keep-copy")
		return ok && k.UID != keep.UID
	})
	select {
	case <-h.done:
		t.Fatal("the engine stopped")
	default:
	}
}

// churnUntilCompacted updates an object until etcd has compacted away the
// revision the churn started at: a watch resuming from there gets 410.
func churnUntilCompacted(t *testing.T, cms interface {
	Create(context.Context, *corev1.ConfigMap, metav1.CreateOptions) (*corev1.ConfigMap, error)
	Update(context.Context, *corev1.ConfigMap, metav1.UpdateOptions) (*corev1.ConfigMap, error)
	List(context.Context, metav1.ListOptions) (*corev1.ConfigMapList, error)
}) {
	t.Helper()
	ctx := t.Context()
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "churn"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := cm.ResourceVersion
	i := 0
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		i++
		cm.Data = map[string]string{"i": strings.Repeat("x", i%7)}
		if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return false, err
		}
		_, err := cms.List(ctx, metav1.ListOptions{ResourceVersion: start, ResourceVersionMatch: metav1.ResourceVersionMatchExact, Limit: 1})
		return apierrors.IsResourceExpired(err) || apierrors.IsGone(err), nil
	})
	if err != nil {
		t.Fatalf("etcd did not compact revision %s: %v", start, err)
	}
	t.Logf("revision %s compacted after %d updates", start, i)
}
