package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syncloop/syncloop/rules"
)

// failover is a TCP proxy standing for the webhook's Service: each
// connection goes to the next backend that accepts one, as kube-proxy
// sends it to an endpoint still listed. TLS passes through.
type failover struct {
	ln       net.Listener
	backends []string
	next     atomic.Uint32
	wg       sync.WaitGroup
}

func newFailover(t *testing.T, backends []string) *failover {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &failover{ln: ln, backends: backends}
	go f.serve()
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *failover) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			var b net.Conn
			for range f.backends {
				addr := f.backends[int(f.next.Add(1))%len(f.backends)]
				if b, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
					break
				}
			}
			if b == nil {
				return
			}
			defer b.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
			<-done
		}()
	}
}

// brokenCall is how a webhook call broken by its replica's death fails.
var brokenCall = regexp.MustCompile(`EOF|connection reset|connection refused|broken pipe|http2: client connection (lost|force closed)`)

// TestConversionAcrossKill: three replicas (leader election: one keeps
// the CRD, all serve conversion) behind a proxy standing for the
// webhook's Service; one is stopped and one killed while clients read
// and write the kind in the converted version without pause: none fails
// across a stop; across a kill only calls the kill broke, and none after.
//
// API server: a CRD converting through a webhook; its retries of a
// webhook call whose connection broke.
func TestConversionAcrossKill(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "conversion-ha")
	file := writeFile(t, t.TempDir(), "gadget.yaml", strings.ReplaceAll(versionedRule, "conversion.syncloop.dev", "ha.syncloop.dev"))
	hooks := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	proxy := newFailover(t, hooks)
	url := "https://" + proxy.ln.Addr().String() + rules.WebhookPath
	var procs []*os.Process
	probes := make([]string, 3)
	for i, hook := range hooks {
		probes[i] = freeAddr(t)
		cmd := syncloopProcess(t, fmt.Sprintf("replica-%d", i), "run", "-f", file, "--kubeconfig", env.Kubeconfig(),
			"--leader-elect", "--leader-elect-namespace", ns, "--metrics-bind-address=0", "--health-probe-bind-address", probes[i],
			"--webhook-bind-address", hook, "--webhook-url", url)
		procs = append(procs, cmd.Process)
	}
	for i := range hooks {
		readyz, poll := probing(t, probes[i], 60*time.Second)
		poll(fmt.Sprintf("replica %d serving conversion", i), func() bool {
			return strings.Contains(readyz(), "conversion webhook: serving ")
		})
	}
	gvr := func(v string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "ha.syncloop.dev", Version: v, Resource: "gadgets"}
	}
	pollUntil(t, 60*time.Second, "the kind served in v1alpha1", func() bool {
		_, err := dc.Resource(gvr("v1alpha1")).Namespace(ns).List(ctx, metav1.ListOptions{})
		return err == nil
	})
	for i := range 20 {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ha.syncloop.dev/v1", "kind": "Gadget",
			"metadata": map[string]any{"name": fmt.Sprintf("g-%02d", i)}, "spec": map[string]any{"replicas": int64(i), "image": "web", "tag": "1"}}}
		if _, err := dc.Resource(gvr("v1")).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Reads and writes in v1alpha1, without pause, while replicas stop:
	// a GET reads etcd and a patch converts both ways, so each goes
	// through the webhook (a LIST may be answered from the API server's
	// watch cache of the version).
	var ops, failed atomic.Int64
	var firstErr atomic.Pointer[string]
	var errsMu sync.Mutex
	var errs []string // the failures' messages, the first 100
	first := func() string {
		if p := firstErr.Load(); p != nil {
			return *p
		}
		return ""
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const clients = 4
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("g-%02d", (w*5+i)%20)
				res := dc.Resource(gvr("v1alpha1")).Namespace(ns)
				_, err := res.Get(ctx, name, metav1.GetOptions{})
				if err == nil {
					_, err = res.Patch(ctx, name, types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"size":%d}}`, i)), metav1.PatchOptions{})
				}
				ops.Add(1)
				if err != nil && !errors.Is(err, ctx.Err()) {
					failed.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					errsMu.Lock()
					if len(errs) < 100 {
						errs = append(errs, msg)
					}
					errsMu.Unlock()
				}
			}
		}()
	}
	served := func(what string) {
		t.Helper()
		before := ops.Load()
		pollUntil(t, 60*time.Second, what, func() bool { return ops.Load() > before+200 })
	}
	served("reads and writes under way")

	// A replica stopped as Kubernetes stops a pod (SIGTERM): none
	// fails, since the stop tells the API server (HTTP/2 GOAWAY) which
	// calls it did not begin, and those go to another replica. Then one
	// killed (SIGKILL): the API server does not retry a conversion call
	// that broke, so the calls on its connections to the replica fail —
	// those under way, and those sent before it sees a connection gone —
	// each a webhook call that broke (nothing else), and none after: the
	// replica left serves every call.
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		failed.Store(0)
		firstErr.Store(nil)
		errsMu.Lock()
		errs = nil
		errsMu.Unlock()
		if err := procs[i].Signal(sig); err != nil {
			t.Fatal(err)
		}
		served(fmt.Sprintf("reads and writes served after %v", sig))
		if n := failed.Load(); sig == syscall.SIGTERM && n > 0 {
			t.Errorf("%d reads and writes failed across %v; the first: %v", n, sig, first())
		}
		errsMu.Lock()
		for _, msg := range errs {
			if !strings.Contains(msg, "conversion webhook") || !brokenCall.MatchString(msg) {
				t.Errorf("across %v, a failure that is not a webhook call broken by the kill: %s", sig, msg)
			}
		}
		errsMu.Unlock()
		t.Logf("%v: %d failed", sig, failed.Load())
	}
	failed.Store(0)
	served("reads and writes on the replica left")
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d reads and writes failed on the replica left; the first: %v", n, first())
	}
	t.Logf("%d reads and writes in v1alpha1 across a stop and a kill", ops.Load())
}
