package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/render"
)

// workload is what a benchmark phase reconciles: one rule (NS stands for
// the namespace) and N triggers of one resource, created before syncloop
// starts.
type workload struct {
	rule string
	// dir, when set, is where the rule file is taken to be: its function's
	// module is there.
	dir     string
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

// prepare makes a namespace (named from prefix) with the workload's n
// triggers — after first, when not nil, has run in it — and parses the
// rule for it.
func (w workload) prepare(ctx context.Context, env *testenv.Env, n int, prefix string, first func(ns string, plain k8sdynamic.Interface) error) (string, k8sdynamic.Interface, *rules.Set, error) {
	admin, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return "", nil, nil, err
	}
	plain, err := k8sdynamic.NewForConfig(env.Config())
	if err != nil {
		return "", nil, nil, err
	}
	ns, err := namespace(ctx, admin, prefix)
	if err != nil {
		return "", nil, nil, err
	}
	if first != nil {
		if err := first(ns, plain); err != nil {
			return "", nil, nil, err
		}
	}
	if err := w.create(ctx, plain, ns, n); err != nil {
		return "", nil, nil, err
	}
	path := prefix + "rules.yaml"
	if w.dir != "" {
		path = filepath.Join(w.dir, "rules.yaml")
	}
	files, err := parseRules([2]string{path, strings.ReplaceAll(w.rule, "NS", ns)})
	if err != nil {
		return "", nil, nil, err
	}
	set, err := rules.NewSet(files...)
	if err != nil {
		return "", nil, nil, err
	}
	return ns, plain, set, nil
}

// limit measures what the API server itself can take: the N server-side
// applies syncloop makes for the workload — the very children, rendered by
// the rule from triggers in a namespace of their own, with syncloop's
// labels, annotations and ownerReference — sent from a plain client-go loop
// with no client-side rate limit and workers goroutines. Creating and
// rendering happen before the clock starts: only the applies are timed.
func (w workload) limit(ctx context.Context, env *testenv.Env, n, workers int) (time.Duration, error) {
	l, err := w.newLimitLoop(ctx, env, n, "bench-limit-")
	if err != nil {
		return 0, err
	}
	defer l.close(ctx)
	return l.apply(ctx, nil, workers)
}

// limitLoop is where a limit is measured: unthrottled clients, and the
// workload's n triggers in a namespace of their own with the rule parsed
// for it.
type limitLoop struct {
	cs       kubernetes.Interface
	dc       k8sdynamic.Interface
	mapper   *dynamic.Mapper
	ns       string
	n        int
	rule     *rules.Rule
	triggers []unstructured.Unstructured
	gvrs     map[schema.GroupVersionResource]bool // of the children applied
}

func (w workload) newLimitLoop(ctx context.Context, env *testenv.Env, n int, prefix string) (*limitLoop, error) {
	cfg := env.Config()
	cfg.QPS = -1
	l := &limitLoop{n: n, gvrs: map[schema.GroupVersionResource]bool{}}
	var err error
	if l.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if l.dc, err = k8sdynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	l.mapper = dynamic.NewMapper(disco, 0)
	if l.ns, err = namespace(ctx, l.cs, prefix); err != nil {
		return nil, err
	}
	if err := w.create(ctx, l.dc, l.ns, n); err != nil {
		return nil, err
	}
	if l.rule, err = parseRule(strings.ReplaceAll(w.rule, "NS", l.ns)); err != nil {
		return nil, err
	}
	list, err := l.dc.Resource(w.trigger).Namespace(l.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	l.triggers = list.Items
	return l, nil
}

// apply renders the rule's children (lookups read from lk) and times their
// server-side applies from workers goroutines.
func (l *limitLoop) apply(ctx context.Context, lk render.Lookuper, workers int) (time.Duration, error) {
	children, gvrs, err := renderChildren(ctx, l.rule, l.triggers, l.mapper, lk)
	if err != nil {
		return 0, err
	}
	if len(children) != l.n {
		return 0, fmt.Errorf("the rule rendered %d children for %d triggers, want one each", len(children), l.n)
	}
	for _, gvr := range gvrs {
		l.gvrs[gvr] = true
	}
	start := time.Now()
	err = parallel(ctx, l.n, workers, func(ctx context.Context, i int) error {
		obj := children[i]
		_, err := l.dc.Resource(gvrs[i]).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), obj,
			metav1.ApplyOptions{FieldManager: l.rule.FieldManager(), Force: true})
		return err
	})
	return time.Since(start), err
}

// close removes the children and the namespace. The children carry
// syncloop's labels: left behind, syncloop's child informer would list
// them too (and without kube-controller-manager deleting the namespace
// does not delete them).
func (l *limitLoop) close(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for gvr := range l.gvrs {
		_ = l.dc.Resource(gvr).Namespace(l.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: rules.LabelRule + "=" + l.rule.Name})
	}
	_ = l.cs.CoreV1().Namespaces().Delete(ctx, l.ns, metav1.DeleteOptions{})
}

// renderChildren renders rule's children of triggers as syncloop applies
// them (with its applied-hash annotation), and their resources.
func renderChildren(ctx context.Context, rule *rules.Rule, triggers []unstructured.Unstructured, mapper *dynamic.Mapper, lk render.Lookuper) ([]*unstructured.Unstructured, []schema.GroupVersionResource, error) {
	var children []*unstructured.Unstructured
	var gvrs []schema.GroupVersionResource
	for i := range triggers {
		rd, err := render.Rule(ctx, render.Input{Rule: rule, Trigger: &triggers[i], Scoper: mapper, Lookups: lk})
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
			ann[rules.AnnotationAppliedHash] = hex.EncodeToString(sum[:8])
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
