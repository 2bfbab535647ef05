package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/internal/webhook"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// conversionRule defines BenchApp in v1 (stored) and v1alpha1, whose
// conversions split and join the image and rename size.
const conversionRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench-conversion}
spec:
  api:
    apiVersion: bench.syncloop.dev/v1
    kind: BenchApp
    versions:
      - name: v1
        storage: true
        spec:
          replicas: integer | default=1
          image: string | default="app"
          tag: string | default="latest"
          labels: map[string]string
      - name: v1alpha1
        spec:
          size: integer | default=1
          image: string | default="app"
          labels: map[string]string
        toHub:
          spec:
            replicas: ${object.spec.size}
            image: ${object.spec.image.split(':')[0]}
            tag: "${object.spec.image.contains(':') ? object.spec.image.split(':')[1] : 'latest'}"
        fromHub:
          spec:
            size: ${object.spec.replicas}
            image: ${object.spec.image + ':' + object.spec.tag}
  status:
    seen: "${true}"
`

// ConversionResult is the conversion phase's outcome.
type ConversionResult struct {
	Objects int `json:"objects"`
	// ListStorageMs and ListConvertedMs are a LIST of every object (pages
	// of 500, as an informer lists) in the storage version and in the
	// other, converted by the webhook: medians of three.
	ListStorageMs   float64 `json:"listStorageMs"`
	ListConvertedMs float64 `json:"listConvertedMs"`
	// Writes patches in each version: their p50/p99 in ms.
	Writes              int     `json:"writes"`
	WriteStorageP50Ms   float64 `json:"writeStorageP50Ms"`
	WriteStorageP99Ms   float64 `json:"writeStorageP99Ms"`
	WriteConvertedP50Ms float64 `json:"writeConvertedP50Ms"`
	WriteConvertedP99Ms float64 `json:"writeConvertedP99Ms"`
	// Reviews the webhook answered, the objects in them, and its latency
	// per review.
	Reviews      int     `json:"reviews"`
	ObjectsTotal int     `json:"objects_converted"`
	ReviewP50Ms  float64 `json:"reviewP50Ms"`
	ReviewP99Ms  float64 `json:"reviewP99Ms"`
}

// reviewTimes records the webhook's latency per review (webhook.Metrics).
type reviewTimes struct {
	mu      sync.Mutex
	times   []time.Duration
	objects int
}

func (r *reviewTimes) Converted(_, _, _, _ string) { r.mu.Lock(); r.objects++; r.mu.Unlock() }
func (r *reviewTimes) Reviewed(_ string, d time.Duration) {
	r.mu.Lock()
	r.times = append(r.times, d)
	r.mu.Unlock()
}

// Refused is not timed: nothing is converted.
func (r *reviewTimes) Refused(string) {}

func (r *reviewTimes) reset() { r.mu.Lock(); r.times, r.objects = nil, 0; r.mu.Unlock() }

// quantiles are the p50 and p99 of ds, in ms.
func quantiles(ds []time.Duration) (p50, p99 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 { return ms(s[min(len(s)-1, int(q*float64(len(s))))]) }
	return at(0.5), at(0.99)
}

// runConversion: n objects of a kind of two versions; LISTs of all of
// them in the storage version and through the conversion webhook, then
// writes in each version, timed, with the webhook's own latency.
func runConversion(ctx context.Context, env *testenv.Env, n, writes int, logf func(string, ...any)) (*ConversionResult, error) {
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	dc, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	ns := "bench-conversion"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	addr, err := testenv.FreeAddress()
	if err != nil {
		return nil, err
	}
	// The webhook, as syncloop serves it: its certificate kept in a Secret.
	loader, err := rules.NewLoader(expr.Options{CostLimit: expr.DefaultCostLimit})
	if err != nil {
		return nil, err
	}
	loader.SetConversionWebhook(rules.ConversionWebhook{URL: "https://" + addr + rules.WebhookPath})
	f, err := loader.Parse("bench-conversion.yaml", []byte(conversionRule))
	if err != nil {
		return nil, err
	}
	set, err := rules.NewSet(f)
	if err != nil {
		return nil, err
	}
	conv := webhook.NewConverter()
	times := &reviewTimes{}
	conv.Metrics = times
	conv.Use(set)
	host, _, _ := net.SplitHostPort(addr)
	certs := webhook.NewCerts(cs, ns, "bench-webhook-tls", []string{host})
	go certs.Run(ctx)
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return certs.CABundle() != nil, nil }); err != nil {
		return nil, fmt.Errorf("the webhook's certificate: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(rules.WebhookPath, conv)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(tlsListener(ln, certs)) }()
	defer srv.Close()

	crd := f.Rules[0].CRD()
	if err := unstructured.SetNestedField(crd.Object, base64.StdEncoding.EncodeToString(certs.CABundle()), "spec", "conversion", "webhook", "clientConfig", "caBundle"); err != nil {
		return nil, err
	}
	data, _ := json.Marshal(crd.Object)
	force := true
	crds := dc.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Patch(ctx, crd.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "bench", Force: &force}); err != nil {
		return nil, err
	}
	res := func(v string) k8sdynamic.ResourceInterface {
		return dc.Resource(schema.GroupVersionResource{Group: "bench.syncloop.dev", Version: v, Resource: "benchapps"}).Namespace(ns)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := res("v1alpha1").List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("the kind served in both versions: %w", err)
	}

	logf("conversion: creating %d objects", n)
	if err := parallel(ctx, n, 32, func(ctx context.Context, i int) error {
		_, err := res("v1").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "bench.syncloop.dev/v1", "kind": "BenchApp",
			"metadata": map[string]any{"name": fmt.Sprintf("app-%05d", i)},
			"spec":     map[string]any{"replicas": int64(i % 7), "image": "registry.example/app", "tag": fmt.Sprint(i), "labels": map[string]any{"team": "a", "tier": "web"}},
		}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	list := func(v string) (time.Duration, error) {
		start, got := time.Now(), 0
		for cont := ""; ; {
			l, err := res(v).List(ctx, metav1.ListOptions{Limit: 500, Continue: cont})
			if err != nil {
				return 0, err
			}
			got += len(l.Items)
			if cont = l.GetContinue(); cont == "" {
				break
			}
		}
		if got != n {
			return 0, fmt.Errorf("listed %d of %d in %s", got, n, v)
		}
		return time.Since(start), nil
	}
	r := &ConversionResult{Objects: n, Writes: writes}
	var storage, converted []time.Duration
	times.reset()
	for range 3 {
		d, err := list("v1")
		if err != nil {
			return nil, err
		}
		storage = append(storage, d)
		if d, err = list("v1alpha1"); err != nil {
			return nil, err
		}
		converted = append(converted, d)
	}
	slices.Sort(storage)
	slices.Sort(converted)
	r.ListStorageMs, r.ListConvertedMs = ms(storage[1]), ms(converted[1])
	logf("conversion: LIST of %d: %.0f ms stored, %.0f ms converted", n, r.ListStorageMs, r.ListConvertedMs)

	write := func(v, field string) ([]time.Duration, error) {
		var mu sync.Mutex
		var ds []time.Duration
		err := parallel(ctx, writes, 16, func(ctx context.Context, i int) error {
			patch := fmt.Sprintf(`{"spec":{%q:%d}}`, field, 100+i)
			start := time.Now()
			_, err := res(v).Patch(ctx, fmt.Sprintf("app-%05d", i%n), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			mu.Lock()
			ds = append(ds, time.Since(start))
			mu.Unlock()
			return err
		})
		return ds, err
	}
	ws, err := write("v1", "replicas")
	if err != nil {
		return nil, err
	}
	r.WriteStorageP50Ms, r.WriteStorageP99Ms = quantiles(ws)
	wc, err := write("v1alpha1", "size")
	if err != nil {
		return nil, err
	}
	r.WriteConvertedP50Ms, r.WriteConvertedP99Ms = quantiles(wc)
	times.mu.Lock()
	r.Reviews, r.ObjectsTotal = len(times.times), times.objects
	r.ReviewP50Ms, r.ReviewP99Ms = quantiles(times.times)
	times.mu.Unlock()
	logf("conversion: %d writes, p99 %.1f ms stored, %.1f ms converted; webhook p99 %.2f ms over %d reviews", writes, r.WriteStorageP99Ms, r.WriteConvertedP99Ms, r.ReviewP99Ms, r.Reviews)
	return r, nil
}

func tlsListener(ln net.Listener, certs *webhook.Certs) net.Listener {
	return tls.NewListener(ln, &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12})
}

func reportConversion(r *ConversionResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — conversion through syncloop's webhook, %d objects\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Objects)
	fmt.Fprintf(&b, "A kind in v1 (stored) and v1alpha1, converted by templates (a rename, an image split and joined); the webhook in process, over TLS on the loopback, its certificate syncloop's own.\n\n")
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| LIST of all %d, pages of 500, in v1 (stored): median of 3 | %.0f ms |\n", r.Objects, r.ListStorageMs)
	fmt.Fprintf(&b, "| LIST of all %d, pages of 500, in v1alpha1 (converted): median of 3 | %.0f ms (%.2f×) |\n", r.Objects, r.ListConvertedMs, r.ListConvertedMs/r.ListStorageMs)
	fmt.Fprintf(&b, "| %d patches in v1 (stored), 16 at a time: p50 / p99 | %.1f / %.1f ms |\n", r.Writes, r.WriteStorageP50Ms, r.WriteStorageP99Ms)
	fmt.Fprintf(&b, "| %d patches in v1alpha1 (converted both ways), 16 at a time: p50 / p99 | %.1f / %.1f ms |\n", r.Writes, r.WriteConvertedP50Ms, r.WriteConvertedP99Ms)
	fmt.Fprintf(&b, "| the webhook: reviews answered (objects) | %d (%d) |\n", r.Reviews, r.ObjectsTotal)
	fmt.Fprintf(&b, "| the webhook's latency per review: p50 / p99 | %.2f / %.2f ms |\n", r.ReviewP50Ms, r.ReviewP99Ms)
	return b.String()
}
