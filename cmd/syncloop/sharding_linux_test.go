package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// shardRule: every ConfigMap labelled shard in NS gets a copy.
const shardRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: shard}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: shard}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: {v: "${object.data.v}"}
`

// shardCluster is a test's namespace, its rule and the replicas of one
// shard group, each a `syncloop run --sharding` process of its own.
type shardCluster struct {
	t        *testing.T
	env      *testenv.Env
	cs       kubernetes.Interface
	ns       string
	dir      string
	rule     string // the rule readyWith waits to run
	replicas map[string]*shardReplica

	mu       sync.Mutex
	added    map[string]int // child name → ADDED events seen
	modified map[string]int // child name → changes seen (resourceVersion moved)
}

type shardReplica struct {
	cmd               *exec.Cmd
	metrics, probes   string
	exited            chan struct{} // closed once the process has exited and waitErr is set
	waitErr           error
	metricsAtExit     string
	stoppedGracefully bool
}

func newShardCluster(t *testing.T) *shardCluster {
	env := testenv.Get(t)
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	sc := &shardCluster{t: t, env: env, cs: cs, ns: newNamespace(t, cs, "shard"), dir: t.TempDir(), rule: "shard",
		replicas: map[string]*shardReplica{}, added: map[string]int{}, modified: map[string]int{}}
	if err := os.WriteFile(filepath.Join(sc.dir, "rules.yaml"), []byte(strings.ReplaceAll(shardRule, "NS", sc.ns)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Every write to a child, as the API server stores it.
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(sc.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = rules.LabelRule + "=shard" }))
	inf := factory.Core().V1().ConfigMaps().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			sc.mu.Lock()
			sc.added[obj.(*corev1.ConfigMap).Name]++
			sc.mu.Unlock()
		},
		UpdateFunc: func(old, obj any) {
			if old.(*corev1.ConfigMap).ResourceVersion != obj.(*corev1.ConfigMap).ResourceVersion {
				sc.mu.Lock()
				sc.modified[obj.(*corev1.ConfigMap).Name]++
				sc.mu.Unlock()
			}
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return sc
}

// start starts replica name.
func (sc *shardCluster) start(name string) *shardReplica {
	r := &shardReplica{metrics: freeAddr(sc.t), probes: freeAddr(sc.t), exited: make(chan struct{})}
	r.cmd = syncloopProcess(sc.t, name, "run", "-f", sc.dir, "--kubeconfig", sc.env.Kubeconfig(), "--sharding",
		"--leader-elect-namespace", sc.ns, "--leader-elect-id", "shard-test", "--leader-elect-identity", name,
		"--metrics-bind-address", r.metrics, "--health-probe-bind-address", r.probes)
	go func() { r.waitErr = r.cmd.Wait(); close(r.exited) }()
	// Before syncloopProcess's cleanup (cleanups run last first): one Wait
	// at a time.
	sc.t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.exited
	})
	sc.replicas[name] = r
	return r
}

// readyWith waits until every running replica is ready and works under
// the view members.
func (sc *shardCluster) readyWith(members ...string) {
	sc.t.Helper()
	want := "members [" + strings.Join(members, ",") + "]"
	for name, r := range sc.replicas {
		select {
		case <-r.exited:
			continue
		default:
		}
		pollUntil(sc.t, 60*time.Second, name+" to be ready with "+want, func() bool {
			resp, err := http.Get("http://" + r.probes + "/readyz")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body := string(b)
			return resp.StatusCode == http.StatusOK && strings.Contains(body, want) && strings.Contains(body, "rule "+sc.rule+": running")
		})
	}
}

// writes is a replica's syncloop_apply_total of action.
func (r *shardReplica) writes(action string) int {
	page := r.metricsAtExit
	if page == "" {
		page = httpGet("http://" + r.metrics + "/metrics")
	}
	return int(metricValue(page, fmt.Sprintf(`syncloop_apply_total{action="%s",rule="shard"}`, action)))
}

// cachedShares waits until the running replicas' caches hold objects
// (triggers and children) once between them, each some: each caches its
// share and nothing of the rest.
func (sc *shardCluster) cachedShares(objects int) {
	sc.t.Helper()
	var got string
	pollUntil(sc.t, 30*time.Second, fmt.Sprintf("%d objects cached once across the replicas", objects), func() bool {
		total, ok := 0, true
		got = ""
		for name, r := range sc.replicas {
			select {
			case <-r.exited:
				continue
			default:
			}
			page := httpGet("http://" + r.metrics + "/metrics")
			n := int(metricValue(page, `syncloop_shard_cached_objects{rule="shard"}`))
			got += fmt.Sprintf(" %s: %d;", name, n)
			total += n
			ok = ok && n > 0
		}
		return ok && total == objects
	})
	sc.t.Logf("cached:%s", got)
}

// stop stops replica name with SIGTERM and waits for it to exit 0.
func (sc *shardCluster) stop(name string) {
	sc.t.Helper()
	r := sc.replicas[name]
	r.metricsAtExit = httpGet("http://" + r.metrics + "/metrics")
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		sc.t.Fatal(err)
	}
	select {
	case <-r.exited:
		if r.waitErr != nil {
			sc.t.Fatalf("%s did not exit cleanly on SIGTERM: %v", name, r.waitErr)
		}
	case <-time.After(60 * time.Second):
		sc.t.Fatalf("%s did not stop", name)
	}
	r.stoppedGracefully = true
}

func (sc *shardCluster) trigger(name, v string) {
	sc.t.Helper()
	_, err := sc.cs.CoreV1().ConfigMaps(sc.ns).Create(sc.t.Context(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"shard": "yes"}},
		Data:       map[string]string{"v": v},
	}, metav1.CreateOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
}

// converged reports whether every trigger's copy exists with its data.
func (sc *shardCluster) converged() bool {
	list, err := sc.cs.CoreV1().ConfigMaps(sc.ns).List(sc.t.Context(), metav1.ListOptions{})
	if err != nil {
		sc.t.Fatal(err)
	}
	byName := map[string]corev1.ConfigMap{}
	for _, cm := range list.Items {
		byName[cm.Name] = cm
	}
	for _, cm := range list.Items {
		if cm.Labels["shard"] == "" {
			continue
		}
		if c, ok := byName[cm.Name+"-copy"]; !ok || c.Data["v"] != cm.Data["v"] {
			return false
		}
	}
	return true
}

// childWrites checks that each of the n children was created once and
// changed modified times in all.
func (sc *shardCluster) childWrites(n, modified int) {
	sc.t.Helper()
	pollUntil(sc.t, 30*time.Second, fmt.Sprintf("%d children seen", n), func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return len(sc.added) >= n
	})
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if len(sc.added) != n {
		sc.t.Errorf("%d children, want %d", len(sc.added), n)
	}
	for name, k := range sc.added {
		if k != 1 {
			sc.t.Errorf("child %s was created %d times", name, k)
		}
	}
	total := 0
	for name, k := range sc.modified {
		total += k
		if k > 1 {
			sc.t.Errorf("child %s was written %d times after its creation", name, k)
		}
	}
	if total != modified {
		sc.t.Errorf("children were changed %d times, want %d", total, modified)
	}
}

func (sc *shardCluster) leaseExists(member string) bool {
	_, err := sc.cs.CoordinationV1().Leases(sc.ns).Get(context.Background(), "shard-test-shard-"+member, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		sc.t.Fatal(err)
	}
	return err == nil
}

// TestSharding: three replicas share 300 triggers — each child is created
// once, each replica makes a fair share; one replica is stopped (SIGTERM):
// it drains and leaves, the others take its triggers at once; one is
// killed (SIGKILL): its Lease expires and is removed, and the last replica
// converges 60 new triggers within 90 s. Every child is written by one
// replica only: created once, changed only when its trigger changed.
func TestSharding(t *testing.T) {
	sc := newShardCluster(t)
	for _, name := range []string{"a", "b", "c"} {
		sc.start(name)
	}
	sc.readyWith("a", "b", "c")

	const n = 300
	for i := range n {
		sc.trigger(fmt.Sprintf("t-%03d", i), "1")
	}
	pollUntil(t, 90*time.Second, "300 triggers to converge", sc.converged)
	sum := 0
	pollUntil(t, 30*time.Second, "the replicas' creates to add up", func() bool {
		sum = 0
		for _, r := range sc.replicas {
			sum += r.writes("create")
		}
		return sum >= n
	})
	if sum != n {
		t.Errorf("the replicas created %d children for %d triggers", sum, n)
	}
	for name, r := range sc.replicas {
		got := r.writes("create")
		t.Logf("replica %s created %d of %d", name, got, n)
		if got < 60 || got > 140 {
			t.Errorf("replica %s created %d children, want %d ± 40 %%", name, got, n/3)
		}
		if u := r.writes("update"); u != 0 {
			t.Errorf("replica %s updated %d children that nothing changed", name, u)
		}
	}
	sc.childWrites(n, 0)
	sc.cachedShares(2 * n)

	// b leaves: it drains, removes its Lease; a and c take its triggers.
	sc.stop("b")
	if sc.leaseExists("b") {
		t.Errorf("b's Lease is still there after it stopped")
	}
	sc.readyWith("a", "c")
	for i := range 30 { // changed: each reaches its copy whoever owned it
		if _, err := sc.cs.CoreV1().ConfigMaps(sc.ns).Patch(t.Context(), fmt.Sprintf("t-%03d", i), types.MergePatchType, []byte(`{"data":{"v":"2"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		sc.trigger(fmt.Sprintf("u-%03d", i), "1")
	}
	pollUntil(t, 60*time.Second, "the triggers to converge after b left", sc.converged)
	sc.cachedShares(2 * (n + 30))

	// c is killed: a removes its Lease once it expires and takes over.
	if err := sc.replicas["c"].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-sc.replicas["c"].exited
	killed := time.Now()
	for i := range 60 {
		sc.trigger(fmt.Sprintf("v-%03d", i), "1")
	}
	pollUntil(t, 90*time.Second, "60 new triggers to converge after c was killed", sc.converged)
	t.Logf("60 new triggers converged %.1fs after c was killed (lease duration %s)", time.Since(killed).Seconds(), manager.LeaseDuration)
	if sc.leaseExists("c") {
		t.Errorf("the killed replica's Lease was not removed")
	}
	sc.readyWith("a")
	sc.childWrites(n+90, 30)
}

// TestShardingScaleUp: one replica reconciles triggers arriving steadily;
// two more join half-way. Together they write nothing a single replica
// would not: one create per child, no update, no delete.
func TestShardingScaleUp(t *testing.T) {
	sc := newShardCluster(t)
	sc.start("a")
	sc.readyWith("a")
	const n = 150
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			if t.Context().Err() != nil {
				return
			}
			sc.trigger(fmt.Sprintf("t-%03d", i), "1")
			time.Sleep(30 * time.Millisecond)
		}
	}()
	pollUntil(t, 30*time.Second, "the first children", func() bool {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		return len(sc.added) >= 20
	})
	sc.start("b")
	sc.start("c")
	<-done
	sc.readyWith("a", "b", "c")
	pollUntil(t, 60*time.Second, "the triggers to converge", sc.converged)
	sc.childWrites(n, 0)
	creates := 0
	for name, r := range sc.replicas {
		creates += r.writes("create")
		t.Logf("replica %s created %d", name, r.writes("create"))
		for _, action := range []string{"update", "delete", "status"} {
			if k := r.writes(action); k != 0 {
				t.Errorf("replica %s: %d %s writes", name, k, action)
			}
		}
	}
	if creates != n {
		t.Errorf("the replicas created %d children for %d triggers", creates, n)
	}
	for _, name := range []string{"b", "c"} {
		if sc.replicas[name].writes("create") == 0 {
			t.Errorf("replica %s joined but created nothing", name)
		}
	}
}
