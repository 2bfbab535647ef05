package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// workload is what a benchmark phase reconciles: one rule (NS stands for
// the namespace) and N triggers of one resource, created before syncloop
// starts.
type workload struct {
	rule    string
	trigger schema.GroupVersionResource
	// make returns trigger i, without namespace.
	make func(i int) *unstructured.Unstructured
}

// create makes the workload's n triggers in ns.
func (w workload) create(ctx context.Context, dc k8sdynamic.Interface, ns string, n int) error {
	return parallel(ctx, n, 32, func(ctx context.Context, i int) error {
		_, err := dc.Resource(w.trigger).Namespace(ns).Create(ctx, w.make(i), metav1.CreateOptions{})
		return err
	})
}

// limit measures what the API server itself can take: the N server-side
// applies syncloop makes for the workload — the very children, rendered by
// the rule from triggers in a namespace of their own, with syncloop's
// labels, annotations and ownerReference — sent from a plain client-go loop
// with no client-side rate limit and workers goroutines. Creating and
// rendering happen before the clock starts: only the applies are timed.
func (w workload) limit(ctx context.Context, env *testenv.Env, n, workers int) (time.Duration, error) {
	cfg := env.Config()
	cfg.QPS = -1
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	dc, err := k8sdynamic.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return 0, err
	}
	ns, err := namespace(ctx, cs, "bench-limit-")
	if err != nil {
		return 0, err
	}
	defer cs.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	if err := w.create(ctx, dc, ns, n); err != nil {
		return 0, err
	}
	rule, err := parseRule(strings.ReplaceAll(w.rule, "NS", ns))
	if err != nil {
		return 0, err
	}
	list, err := dc.Resource(w.trigger).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	children, mappings, err := renderChildren(ctx, rule, list.Items, dynamic.NewMapper(disco, 0), nil)
	if err != nil {
		return 0, err
	}
	if len(children) != n {
		return 0, fmt.Errorf("the rule rendered %d children for %d triggers, want one each", len(children), n)
	}
	start := time.Now()
	err = parallel(ctx, n, workers, func(ctx context.Context, i int) error {
		obj := children[i]
		_, err := dc.Resource(mappings[i]).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), obj,
			metav1.ApplyOptions{FieldManager: rules.FieldManagerPrefix + rule.Name, Force: true})
		return err
	})
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	// They carry syncloop's labels: left behind, syncloop's child informer
	// would list them too. (Without kube-controller-manager deleting the
	// namespace does not delete them.)
	for _, gvr := range mappings[:1] {
		if err := dc.Resource(gvr).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: rules.LabelRule + "=" + rule.Name}); err != nil {
			return 0, err
		}
	}
	return took, nil
}

// renderChildren renders rule's children of triggers as syncloop applies
// them (with its applied-hash annotation), and their resources.
func renderChildren(ctx context.Context, rule *rules.Rule, triggers []unstructured.Unstructured, mapper *dynamic.Mapper, lk rules.Lookuper) ([]*unstructured.Unstructured, []schema.GroupVersionResource, error) {
	var children []*unstructured.Unstructured
	var gvrs []schema.GroupVersionResource
	for i := range triggers {
		rd, err := rule.Render(ctx, &triggers[i], mapper, lk)
		if err != nil {
			return nil, nil, err
		}
		for _, ch := range rd.Children {
			obj := ch.Object
			data, err := json.Marshal(obj.Object)
			if err != nil {
				return nil, nil, err
			}
			sum := sha256.Sum256(data)
			ann := obj.GetAnnotations()
			ann[engine.AnnotationAppliedHash] = hex.EncodeToString(sum[:8])
			obj.SetAnnotations(ann)
			m, err := mapper.Mapping(ctx, obj.GroupVersionKind())
			if err != nil {
				return nil, nil, err
			}
			children = append(children, obj)
			gvrs = append(gvrs, m.Resource)
		}
	}
	return children, gvrs, nil
}

// parseRules parses rule files given as name → text.
func parseRules(files ...[2]string) ([]*rules.File, error) {
	loader, err := rules.NewLoader(expr.Options{})
	if err != nil {
		return nil, err
	}
	var out []*rules.File
	for _, nt := range files {
		f, err := loader.Parse(nt[0], []byte(nt[1]))
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	return out, nil
}

// parseRule parses the one rule of text.
func parseRule(text string) (*rules.Rule, error) {
	files, err := parseRules([2]string{"bench.yaml", text})
	if err != nil {
		return nil, err
	}
	set, err := rules.NewSet(files...)
	if err != nil {
		return nil, err
	}
	if set.Len() != 1 {
		return nil, fmt.Errorf("%d rules, want 1", set.Len())
	}
	return set.Rules()[0], nil
}
