package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// metricValue is the value of one series on a /metrics page ("name" or
// `name{label="v",…}` as the page writes it); 0 when absent.
func metricValue(page, series string) float64 {
	for _, l := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// TestPushback runs `syncloop run` with its defaults as a ServiceAccount
// whose requests API Priority and Fairness serves one at a time and rejects
// beyond that (429 with Retry-After) — a cluster pushing back. Every
// trigger converges; the 429s happen, show in /metrics and are retried by
// the flow control, and none turns into a failed reconcile or a Failed
// Event.
func TestPushback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane of its own")
	}
	t.Parallel() // a control plane of its own: nothing shared with the other tests
	ctx := t.Context()
	env, err := testenv.Start(ctx, testenv.Options{APIServerArgs: testenv.TightAPIServerArgs})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Stop()
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs, "pushback")
	sa, err := env.OneSeat(ctx, ns, "syncloop")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, sa, "syncloop"); err != nil {
		t.Fatal(err)
	}
	const triggers = 300
	var wg sync.WaitGroup
	errs := make(chan error, triggers)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < triggers; i += 8 {
				_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t-%03d", i), Labels: map[string]string{"pushback": "yes"}},
					Data:       map[string]string{"v": strconv.Itoa(i)},
				}, metav1.CreateOptions{})
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rule := strings.ReplaceAll(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: copy}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: pushback}
  resources:
    - id: copy
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-copy"}
        data: {v: "${object.data.v}"}
`, "NS", ns)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	metrics, _ := runInProcess(t, "-f", dir, "--kubeconfig", kubeconfig)
	pollUntil(t, 3*time.Minute, "every trigger's copy", func() bool {
		list, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelRule + "=copy"})
		return err == nil && len(list.Items) == triggers
	})
	took := time.Since(start)

	page := httpGet("http://" + metrics + "/metrics")
	tooMany := metricValue(page, "syncloop_api_too_many_requests_total")
	waited := metricValue(page, `syncloop_api_throttled_seconds_total{reason="retry-after"}`)
	t.Logf("%d triggers converged in %v under pushback: %.0f 429s, %.1fs waited on Retry-After, concurrency limit now %.0f",
		triggers, took.Round(time.Millisecond), tooMany, waited, metricValue(page, "syncloop_api_concurrency_limit"))
	if tooMany == 0 || waited == 0 {
		t.Errorf("the API server refused nothing (429s %.0f, waited %.1fs): the test does not push back", tooMany, waited)
	}
	if failed := metricValue(page, `syncloop_reconcile_total{result="error",rule="copy"}`); failed != 0 {
		t.Errorf("%.0f reconciles failed: a 429 must be retried by the flow control, not fail a reconcile", failed)
	}
	events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Reason == "Failed" {
			t.Errorf("Failed Event on %s: %s", e.InvolvedObject.Name, e.Message)
		}
	}
}
