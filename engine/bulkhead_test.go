package engine

import (
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/fleet"
	"github.com/syncloop/syncloop/rules"
)

// holdingProxy is an API server behind a proxy that answers everything
// but, while holding, keeps every PATCH open until its client gives up.
type holdingProxy struct {
	srv *httptest.Server
	mu  sync.Mutex
	on  bool
	// held counts the PATCHes held.
	held     int
	released chan struct{} // closed by release
}

func newHoldingProxy(t *testing.T, cfg *rest.Config) *holdingProxy {
	t.Helper()
	target, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &holdingProxy{on: true, released: make(chan struct{})}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = rt
	p.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPatch && p.holding() {
			_, _ = io.Copy(io.Discard, r.Body) // read whole: the server sees the client go
			select {                           // held until the client gives up
			case <-r.Context().Done():
			case <-p.released:
				http.Error(w, "released", http.StatusServiceUnavailable)
			}
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *holdingProxy) holding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on {
		p.held++
	}
	return p.on
}

func (p *holdingProxy) release() {
	p.mu.Lock()
	p.on = false
	p.mu.Unlock()
	close(p.released)
}

func (p *holdingProxy) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// kubeconfig reaches the API server through p with token.
func (p *holdingProxy) kubeconfig(t *testing.T, token string) []byte {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["slow"] = &clientcmdapi.Cluster{Server: p.srv.URL, CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["slow"] = &clientcmdapi.Context{Cluster: "slow", AuthInfo: "u"}
	kc.CurrentContext = "slow"
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHungClusterIsABulkhead: the attack of a workload cluster that
// answers everything but holds every write open. Its writes end at their
// deadline and hold at most the cluster's share of the rule's workers:
// the triggers' children at home and in the other cluster are made,
// those of a trigger made meanwhile too; the cluster is set aside as not
// answering; the engine stops within its drain; once the cluster writes
// again, its children are made there.
//
// API server: three control planes: syncloop's, fast, and slow behind
// the holding proxy.
func TestHungClusterIsABulkhead(t *testing.T) {
	h := newHarness(t)
	h.goParallel() // before the inventory: a serial test would find it running
	w := startWorkloads(t, "fast", "slow")
	fast, slowCluster := w[0], w[1]
	proxy := newHoldingProxy(t, slowCluster.env.Config())
	inv := fleet.New(h.cs, h.ns, fleet.Options{ProbeInterval: 100 * time.Millisecond, Bounds: dynamic.Bounds{Timeout: 2 * time.Second},
		Configure: func(cfg *rest.Config) { cfg.QPS = -1 }}) // as the manager's: no client-side bucket
	go inv.Run(h.t.Context())
	h.fleet = inv
	h.putCluster(fast, nil)
	slow := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "slow-kubeconfig", Labels: map[string]string{rules.LabelClusterName: "slow"}},
		Data: map[string][]byte{fleet.KubeconfigKey: proxy.kubeconfig(t, slowCluster.env.Config().BearerToken)}}
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(t.Context(), slow, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bulkhead}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "bulk"}
  workers: 8
  resources:
    - id: home
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-home", namespace: NS}
    - id: away
      clusters: {names: [fast, slow]}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}", namespace: default}
`
	const n = 24
	var names []string
	for i := range n {
		names = append(names, "b"+string(rune('a'+i)))
	}
	for _, name := range names {
		h.createCM(name, map[string]string{"bulk": "yes"}, nil)
	}
	have := func(names []string, where string) bool {
		for _, name := range names {
			var err error
			switch where {
			case "home":
				_, err = h.cs.CoreV1().ConfigMaps(h.ns).Get(t.Context(), name+"-home", metav1.GetOptions{})
			case "fast":
				_, err = fast.cs.CoreV1().ConfigMaps("default").Get(t.Context(), name, metav1.GetOptions{})
			case "slow":
				_, err = slowCluster.cs.CoreV1().ConfigMaps("default").Get(t.Context(), name, metav1.GetOptions{})
			}
			if err != nil {
				return false
			}
		}
		return true
	}
	h.start(h.loadRules(rule))
	h.eventually("every child at home and in fast while slow holds its writes", func() bool { return have(names, "home") && have(names, "fast") })
	if proxy.heldCount() == 0 {
		t.Fatal("no write to slow was held: the test shows nothing")
	}
	h.eventually("slow set aside as not answering", func() bool {
		for _, st := range inv.Statuses() {
			if st.Name == "slow" && st.Down != nil {
				return true
			}
		}
		return false
	})
	h.createCM("late", map[string]string{"bulk": "yes"}, nil)
	h.eventually("the children of a trigger made meanwhile at home and in fast", func() bool { return have([]string{"late"}, "home") && have([]string{"late"}, "fast") })
	if have(names, "slow") {
		t.Fatal("slow's children were made although it held every write")
	}

	// Stopping ends the held writes: their deadline, the drain.
	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute): // a hang guard, not a measure
		t.Fatal("the engine did not stop while a cluster held its writes")
	}

	proxy.release()
	h.start(h.loadRules(rule))
	h.eventually("every child in slow once it writes again", func() bool { return have(append(names, "late"), "slow") })
	if st := inv.Statuses(); len(st) != 2 || st[0].Down != nil || st[1].Down != nil {
		t.Errorf("statuses %v once every cluster answers", st)
	}
	for _, st := range inv.Statuses() {
		if st.Down != nil && !strings.Contains(st.Down.Error(), "within") {
			t.Errorf("cluster %s down for %v", st.Name, st.Down)
		}
	}
}

// TestTakeBoundsWaiters: a place's slots let no more than its share of
// the rule's workers wait on its cluster; one more waits slotWait, then
// its children there wait instead.
func TestTakeBoundsWaiters(t *testing.T) {
	p := &place{cluster: "c", slots: make(chan struct{}, 2)}
	var releases []func()
	for range 2 {
		r, ok := p.take(context.Background())
		if !ok {
			t.Fatal("a free slot was not taken")
		}
		releases = append(releases, r)
	}
	if _, ok := p.take(context.Background()); ok {
		t.Fatal("a third worker took a slot of two")
	}
	if err := p.busy(); !strings.Contains(err.Error(), `cluster "c"`) || !strings.Contains(err.Error(), "2 of the rule's workers") {
		t.Errorf("busy = %v", err)
	}
	releases[0]()
	if _, ok := p.take(context.Background()); !ok {
		t.Error("a slot given back was not taken again")
	}
}

// panickyFleet is a Fleet whose Clusters panics the first n times.
type panickyFleet struct {
	Fleet
	mu sync.Mutex
	n  int
}

func (f *panickyFleet) Clusters() []rules.Cluster {
	f.mu.Lock()
	boom := f.n > 0
	f.n--
	f.mu.Unlock()
	if boom {
		panic("injected into the inventory")
	}
	return f.Fleet.Clusters()
}

// TestFleetLoopPanicContained: a panic in a step of a rule's places (the
// inventory's answer) fails the step, is counted, and the rule goes on:
// its children reach the cluster once the step runs again.
//
// API server: one control plane, in the inventory as cluster self.
func TestFleetLoopPanicContained(t *testing.T) {
	h := newHarness(t)
	h.goParallel() // before the inventory: a serial test would find it running
	inv := h.runInventory(false)
	h.fleet = &panickyFleet{Fleet: inv, n: 2}
	m := &recordingMetrics{}
	h.metrics = m
	h.putCluster(&workload{name: "self", env: h.env, cs: h.cs}, nil)
	h.createCM("t0", map[string]string{"away": "yes"}, nil)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: away}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "away"}
  resources:
    - id: copy
      clusters: {names: [self]}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy", namespace: NS}
`))
	h.eventually("the copy in cluster self", func() bool { _, ok := h.configMap(h.ns, "t0-copy"); return ok })
	if n := m.panicked("away", PanicLoop); n == 0 {
		t.Errorf("%d panics of the places counted, want them counted", n)
	}
}

// TestPlanListsUnreachable: a dry run over a cluster that does not answer
// plans its children there as waiting, naming the cluster and why — not
// as nothing to do.
//
// API server: one control plane; cluster gone is a closed port.
func TestPlanListsUnreachable(t *testing.T) {
	h := newHarness(t)
	h.goParallel() // before the inventory: a serial test would find it running
	inv := fleet.New(h.cs, h.ns, fleet.Options{Bounds: dynamic.Bounds{Timeout: 2 * time.Second}})
	go inv.Run(h.t.Context())
	h.fleet = inv
	closed := httptest.NewTLSServer(http.NotFoundHandler())
	closed.Close() // its port answers nothing now
	gone := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gone-kubeconfig", Labels: map[string]string{rules.LabelClusterName: "gone"}},
		Data: map[string][]byte{fleet.KubeconfigKey: (&holdingProxy{srv: closed}).kubeconfig(t, "t0ken")}}
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(t.Context(), gone, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	planner := &recordingPlanner{}
	h.plan = planner
	h.createCM("t0", map[string]string{"away": "yes"}, nil)
	h.start(h.loadRules(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: away}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: "away"}
  resources:
    - id: copy
      clusters: {names: [gone]}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy", namespace: default}
`))
	h.eventually("t0's copy planned as waiting in cluster gone", func() bool {
		planner.mu.Lock()
		defer planner.mu.Unlock()
		for _, a := range planner.actions {
			if a.Action == ActionWait && a.Cluster == "gone" && a.Object.Name == "t0-copy" && a.Reason != "" {
				return true
			}
		}
		return false
	})
}
