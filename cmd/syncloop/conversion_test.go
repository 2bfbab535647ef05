package main

import (
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/rules"
)

// versionedRule defines Gadget in two versions: v1alpha1 (size, image with
// its tag) and v1 (replicas, image and tag apart, ports), stored in v1.
const versionedRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata:
  name: gadget
spec:
  api:
    apiVersion: conversion.syncloop.dev/v1
    kind: Gadget
    versions:
      - name: v1
        storage: true
        spec:
          replicas: integer | default=1 minimum=0
          image: string | required=true
          tag: string | default="latest"
          ports: "[]integer"
      - name: v1alpha1
        deprecated: true
        deprecationWarning: conversion.syncloop.dev/v1alpha1 Gadget is deprecated; use v1
        spec:
          size: integer | default=1
          image: string | required=true
        toHub:
          spec:
            replicas: ${object.spec.size}
            image: ${object.spec.image.split(':')[0]}
            tag: "${object.spec.image.contains(':') ? object.spec.image.split(':')[1] : 'latest'}"
          lossy: [spec.ports]
        fromHub:
          spec:
            size: ${object.spec.replicas}
            image: ${object.spec.image + ':' + object.spec.?tag.orValue('latest')}
  resources:
    - id: config
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}"}
        data: {image: "${object.spec.image}:${object.spec.tag}", replicas: "${string(object.spec.replicas)}"}
`

// warnings collects the API server's warnings.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.seen, "\n")
}

// TestConversionWebhook: a kind of two versions, converted by syncloop's
// webhook (reached by clientConfig.url on the loopback, its certificate
// syncloop's own, kept in a Secret): an object written in either version
// reads in both; a field only v1 has survives an update through v1alpha1;
// v1alpha1 warns that it is deprecated; conversions are counted.
//
// API server: a CRD converting through a webhook, its CA bundle, reads
// and writes in both versions, deprecation warnings.
func TestConversionWebhook(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "conversion")
	hook := freeAddr(t)
	file := writeFile(t, t.TempDir(), "gadget.yaml", versionedRule)
	args := []string{"--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
		"--webhook-bind-address", hook, "--webhook-url", "https://" + hook + rules.WebhookPath}
	metricsAddr, probes, stop := startInProcess(t, append([]string{"-f", file}, args...)...)
	t.Cleanup(stop)
	readyz, poll := probing(t, probes, 60*time.Second)
	poll("the rule running and the webhook serving", func() bool {
		r := readyz()
		return strings.Contains(r, "rule gadget: running") && strings.Contains(r, "conversion webhook: serving ")
	})
	crd, err := dc.Resource(crdGVR).Get(ctx, "gadgets.conversion.syncloop.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s, _, _ := unstructured.NestedString(crd.Object, "spec", "conversion", "webhook", "clientConfig", "caBundle"); s == "" {
		t.Fatal("the CRD has no CA bundle")
	}
	secret, err := cs.CoreV1().Secrets(ns).Get(ctx, "syncloop-webhook-tls", metav1.GetOptions{})
	if err != nil || len(secret.Data["tls.crt"]) == 0 || len(secret.Data["ca.crt"]) == 0 {
		t.Fatalf("the webhook's Secret: %v", err)
	}

	warned := &warnings{}
	cfg := rest.CopyConfig(env.Config())
	cfg.WarningHandler = warned
	wc, err := k8sdynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gvr := func(v string) k8sdynamic.ResourceInterface {
		return wc.Resource(schema.GroupVersionResource{Group: "conversion.syncloop.dev", Version: v, Resource: "gadgets"}).Namespace(ns)
	}
	obj := func(doc string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		return u
	}

	// Written in v1alpha1, read in v1 and reconciled from it.
	if _, err := gvr("v1alpha1").Create(ctx, obj(`{apiVersion: conversion.syncloop.dev/v1alpha1, kind: Gadget, metadata: {name: old}, spec: {size: 2, image: "nginx:1.29"}}`), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating in v1alpha1: %v", err)
	}
	if !strings.Contains(warned.all(), "conversion.syncloop.dev/v1alpha1 Gadget is deprecated; use v1") {
		t.Errorf("no deprecation warning for v1alpha1: %q", warned.all())
	}
	got, err := gvr("v1").Get(ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading in v1: %v", err)
	}
	spec, _, _ := unstructured.NestedMap(got.Object, "spec")
	if spec["replicas"] != int64(2) || spec["image"] != "nginx" || spec["tag"] != "1.29" {
		t.Errorf("v1alpha1 object read in v1: spec %v", spec)
	}
	poll("the child rendered from the converted object", func() bool {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "old", metav1.GetOptions{})
		return err == nil && cm.Data["image"] == "nginx:1.29" && cm.Data["replicas"] == "2"
	})

	// Written in v1 with ports, which v1alpha1 cannot hold: a client of
	// v1alpha1 scales it, and the ports survive.
	if _, err := gvr("v1").Create(ctx, obj(`{apiVersion: conversion.syncloop.dev/v1, kind: Gadget, metadata: {name: new}, spec: {replicas: 1, image: web, tag: "2", ports: [80, 443]}}`), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating in v1: %v", err)
	}
	// syncloop writes the status meanwhile: read and update again on a
	// conflict, as a client does.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		alpha, err := gvr("v1alpha1").Get(ctx, "new", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if spec, _, _ := unstructured.NestedMap(alpha.Object, "spec"); spec["size"] != int64(1) || spec["image"] != "web:2" || spec["ports"] != nil {
			t.Errorf("v1 object read in v1alpha1: spec %v", spec)
		}
		if err := unstructured.SetNestedField(alpha.Object, int64(4), "spec", "size"); err != nil {
			return err
		}
		_, err = gvr("v1alpha1").Update(ctx, alpha, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating in v1alpha1: %v", err)
	}
	got, err = gvr("v1").Get(ctx, "new", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _, _ = unstructured.NestedMap(got.Object, "spec")
	if spec["replicas"] != int64(4) || len(spec["ports"].([]any)) != 2 {
		t.Errorf("after a v1alpha1 update, v1 spec %v: want replicas 4 and the ports kept", spec)
	}
	if a := got.GetAnnotations(); a[rules.AnnotationConversionPrefix+"v1"] != "" {
		t.Errorf("the round-trip annotation is left on the v1 object: %v", a)
	}
	list, err := gvr("v1alpha1").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("listing in v1alpha1: %v", err)
	}
	poll("conversions counted", func() bool {
		return strings.Contains(httpGet("http://"+metricsAddr+"/metrics"), `syncloop_conversions_total{from="v1",kind="Gadget",result="converted",to="v1alpha1"}`)
	})

	// The rule gone and syncloop restarted: the CRD stays, and so does
	// its conversion, compiled from the CRD itself.
	stop()
	other := writeFile(t, t.TempDir(), "other.yaml", namespaceRule("other", ns))
	_, probes = runInProcess(t, append([]string{"-f", other}, args...)...)
	readyz, poll = probing(t, probes, 60*time.Second)
	poll("the webhook serving the removed rule's kind", func() bool {
		return strings.Contains(readyz(), "conversion webhook: serving ")
	})
	alpha, err := gvr("v1alpha1").Get(ctx, "new", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading in v1alpha1 with the rule removed: %v", err)
	}
	if size, _, _ := unstructured.NestedInt64(alpha.Object, "spec", "size"); size != 4 {
		t.Errorf("with the rule removed, v1alpha1 size %d, want 4", size)
	}
}
