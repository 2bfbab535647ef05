package expr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/interpreter"
	"k8s.io/apiserver/pkg/cel/library"
)

// heavy compares each of object.spec.values with each other: the
// benchmark's CEL-heavy rule.
const heavy = "object.spec.values.map(v, object.spec.values.filter(w, (v + w) % 7 == 0).size()).filter(c, c > 8).size()"

func valuesObject(n int) map[string]any {
	values := make([]any, n)
	for j := range values {
		values[j] = int64((7919 + j*104729) % 1000)
	}
	return map[string]any{"spec": map[string]any{"values": values}}
}

// TestCostPlan: a program whose worst case is within the limit is never
// tracked; one that iterates over its input runs untracked when the
// input's sizes keep it within the limit, and tracked — stopped at the
// limit — when they do not.
func TestCostPlan(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 1_000_000})
	compile := func(src string) *Program {
		t.Helper()
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		p.cost.once.Do(p.cost.make)
		return p
	}
	for _, src := range []string{"object.metadata.name", "object.spec.replicas > 3 ? 'big' : 'small'", "[1, 2, 3].map(x, x * 2)"} {
		if p := compile(src); p.cost.fast == nil || !p.cost.bounded {
			t.Errorf("%s: not bounded within the limit over every input (%+v)", src, p.cost)
		}
	}
	// join's estimate leaves out the size of what it joins.
	if p := compile("object.spec.values.map(v, string(v)).join(',')"); p.cost.fast != nil {
		t.Errorf("join: may run untracked, but its estimate is not a bound")
	}
	p := compile(heavy)
	if p.cost.bounded {
		t.Fatalf("%s: bounded over every input, but a long list costs more than the limit", heavy)
	}
	if !p.cost.untracked(&Activation{Object: valuesObject(64)}) {
		t.Errorf("%s over 64 values: tracked, though their sizes bound it within the limit", heavy)
	}
	if p.cost.untracked(&Activation{Object: valuesObject(1000)}) {
		t.Errorf("%s over 1,000 values: untracked, though it may cost more than the limit", heavy)
	}
	if _, err := p.Eval(context.Background(), &Activation{Object: valuesObject(64)}); err != nil {
		t.Errorf("over 64 values: %v", err)
	}
	if _, err := p.Eval(context.Background(), &Activation{Object: valuesObject(1000)}); !errors.Is(err, ErrCostLimit) {
		t.Errorf("over 1,000 values: err = %v, want ErrCostLimit", err)
	}
}

// costCorpus are expressions of every kind the libraries offer that cost
// more with larger input: each must have its actual cost bounded by the
// estimate from its input's sizes.
var costCorpus = []string{
	heavy,
	"object.spec.values.filter(v, object.spec.values.filter(w, w < v).size() > 32).size()",
	"object.spec.values.all(v, v >= 0) && object.spec.values.exists(v, v > 500)",
	"object.spec.values.exists_one(v, v == 7)",
	"object.spec.values.map(v, string(v)).join(',')",
	"object.spec.values.map(v, [v, v]).flatten().size()",
	"object.spec.values.sort().slice(0, 1)",
	"sets.contains(object.spec.values, [1, 2, 3])",
	"math.greatest(object.spec.values.map(v, double(v)))",
	"object.spec.values + object.spec.values",
	"object.metadata.name + '-' + object.metadata.namespace",
	"object.metadata.name.split('-').map(s, s.upperAscii()).join('')",
	"object.metadata.name.replace('a', 'bb').size()",
	"object.metadata.name.contains('x') || object.metadata.name.startsWith('y') || object.metadata.name.endsWith('z')",
	"object.metadata.name.matches('^[a-z-]+$')",
	"object.metadata.name.find('[0-9]+')",
	"object.metadata.name.findAll('[a-z]')",
	"object.metadata.name.lowerAscii().trim().indexOf('a')",
	"object.metadata.labels.exists(k, k.startsWith('app'))",
	"object.metadata.labels.all(k, object.metadata.labels[k].size() < 64)",
	"object.metadata.labels.map(k, k + '=' + object.metadata.labels[k]).join(',')",
	"object.metadata.labels.transformMap(k, v, v + v)",
	"object.metadata.labels.all(k, v, k.size() + v.size() < 100)",
	"object.spec.items.map(i, i.name + ':' + string(i.port)).join(' ')",
	"object.spec.items.filter(i, i.tags.exists(t, t == 'x')).size()",
	"object.spec.items.map(i, i.tags.map(t, t + i.name)).flatten()",
	"object.spec.items.exists(i, object.spec.items.exists(j, i.name == j.name && i.port != j.port))",
	"object.spec.items.transformList(i, v, v.name)",
	"url(object.spec.url).getHost()",
	"quantity(object.spec.memory).isGreaterThan(quantity('1Gi'))",
	"isCIDR(object.spec.cidr) && cidr(object.spec.cidr).containsIP('10.0.0.1')",
	"ip(object.spec.ip).family()",
	"format.dns1123Label().validate(object.metadata.name).hasValue()",
	"isSemver(object.spec.version) && semver(object.spec.version).isGreaterThan(semver('1.0.0'))",
	"object.spec.values.map(v, object.metadata.name.split('-').map(s, s + string(v))).flatten().join('')",
	"'%s has %d values'.format([object.metadata.name, object.spec.values.size()])",
	"base64.encode(bytes(object.metadata.name))",
	"[object.metadata.name, object.metadata.namespace].map(s, s.reverse())",
	"object.?spec.?missing.orValue([]).size()",
	"object.spec.items.map(i, i.tags.join(',')).filter(s, s.size() > 0).size()",
	// Charged by callCosts, counted before the call: the estimate must
	// still bound the charge.
	"object.metadata.name.replace('a', object.metadata.namespace).size()",
	"string(object.metadata.name).indexOf(object.metadata.namespace)",
	"object.metadata.name.reverse().size() + object.spec.values.reverse().size()",
	"object.spec.items.map(i, i.name.findAll('[a-z]+')).size()",
}

// randomObject is an object of the shape costCorpus reads, of sizes up to
// n.
func randomObject(r *rand.Rand, n int) map[string]any {
	word := func() string {
		var b strings.Builder
		for range r.IntN(n) + 1 {
			b.WriteByte("abcxyz-09"[r.IntN(9)])
		}
		return b.String()
	}
	values := make([]any, r.IntN(n)+1)
	for i := range values {
		values[i] = int64(r.IntN(1000))
	}
	labels := map[string]any{}
	for range r.IntN(n) + 1 {
		labels["app"+word()] = word()
	}
	items := make([]any, r.IntN(n)+1)
	for i := range items {
		tags := make([]any, r.IntN(n))
		for j := range tags {
			tags[j] = word()
		}
		items[i] = map[string]any{"name": word(), "port": int64(r.IntN(65536)), "tags": tags}
	}
	return map[string]any{
		"metadata": map[string]any{"name": "n" + word(), "namespace": word(), "labels": labels},
		"spec": map[string]any{"values": values, "items": items, "url": "https://" + word() + ".example/x",
			"memory": fmt.Sprintf("%dMi", r.IntN(4096)), "cidr": "10.0.0.0/8", "ip": "10.1.2.3", "version": "1.2.3"},
	}
}

// estimateAtSizes is p's cost estimate with every value it reads of the
// size of the largest of them in a.
func estimateAtSizes(p *Program, a *Activation) (checker.CostEstimate, error) {
	sizes := &uniformSizes{size: 1}
	if _, err := p.cost.env.EstimateCost(p.cost.estimated, &library.CostEstimator{SizeEstimator: sizes}); err != nil {
		return checker.CostEstimate{}, err
	}
	largest := uint64(1)
	for _, path := range sizes.paths {
		size, ok := sizeAt(a.native(path[0]), path[1:])
		if !ok {
			return checker.CostEstimate{Max: math.MaxUint64}, nil
		}
		largest = max(largest, size)
	}
	return p.cost.env.EstimateCost(p.cost.estimated, &library.CostEstimator{SizeEstimator: &uniformSizes{size: largest}})
}

// TestCostEstimateBoundsActual: for every expression of costCorpus over
// random objects, what the cost tracker counts is at most the estimate
// with every value read of the largest size there is — which the plan
// relies on to run an evaluation untracked.
func TestCostEstimateBoundsActual(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 1 << 62})
	r := rand.New(rand.NewPCG(1, 2))
	used, bounded := map[string]bool{}, 0
	for _, src := range costCorpus {
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		p.cost.once.Do(p.cost.make)
		native := p.cost.estimated.NativeRep()
		ast.PreOrderVisit(native.Expr(), ast.NewExprVisitor(func(e ast.Expr) {
			for _, id := range native.GetOverloadIDs(e.ID()) {
				used[id] = true
			}
		}))
		if p.cost.fast == nil {
			continue // always tracked
		}
		estimated := 0
		for i := range 60 {
			obj := randomObject(r, 1+i%20)
			a := &Activation{Object: obj}
			est, err := estimateAtSizes(p, a)
			if err != nil {
				t.Fatalf("%s: %v", src, err)
			}
			act, err := interpreter.NewActivation(a.vars(nil))
			if err != nil {
				t.Fatal(err)
			}
			_, details, err := p.prog.ContextEval(context.Background(), act)
			if err != nil {
				continue // the object does not fit the expression
			}
			if est.Max == math.MaxUint64 {
				continue // no bound: tracked
			}
			estimated++
			if actual := *details.ActualCost(); actual > est.Max {
				t.Errorf("%s: actual cost %d > estimated %d over %v", src, actual, est.Max, obj)
				break
			}
		}
		if estimated > 0 {
			bounded++
		}
	}
	// Expressions calling what the estimate cannot bound (flatten,
	// format, sets.contains, …: cost.go's estimable) are always tracked.
	if bounded < len(costCorpus)*2/3 {
		t.Errorf("%d of %d expressions estimated from their inputs' sizes: the test checks too little", bounded, len(costCorpus))
	}
	for _, id := range vettedOverloads {
		if !used[id] {
			t.Errorf("overload %s is trusted to be estimated (vettedOverloads) but no expression here calls it", id)
		}
	}
}

// TestCostPlanKeepsTheLimit: at limits from 100 to 100,000, an evaluation
// of an expression of costCorpus over a random object that the plan lets
// run untracked is one the tracker would not have stopped.
func TestCostPlanKeepsTheLimit(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var untracked, tracked int
	for _, limit := range []uint64{100, 1000, 10_000, 100_000} {
		c := newCompiler(t, Options{CostLimit: limit})
		for _, src := range costCorpus {
			p, err := c.Compile(src, Scope{}, AnyResult)
			if err != nil {
				t.Fatalf("%s: %v", src, err)
			}
			for i := range 40 {
				obj := randomObject(r, 1+i)
				a := &Activation{Object: obj}
				if !p.cost.untracked(a) {
					tracked++
					continue
				}
				untracked++
				act, err := interpreter.NewActivation(a.vars(nil))
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := p.prog.ContextEval(context.Background(), act); err != nil && strings.Contains(err.Error(), "cost limit") {
					t.Errorf("limit %d: %s ran untracked over %v, but the tracker stops it: %v", limit, src, obj, err)
				}
			}
		}
	}
	if untracked == 0 || tracked == 0 {
		t.Errorf("%d evaluations untracked, %d tracked: the test must see both", untracked, tracked)
	}
}

func BenchmarkCostTracking(b *testing.B) {
	c := newCompiler(b, Options{})
	for _, bc := range []struct{ name, src string }{
		{"heavy", heavy},
		{"labels", "object.metadata.labels.exists(k, k.startsWith('app'))"},
		{"field", "object.metadata.name"},
	} {
		p, err := c.Compile(bc.src, Scope{}, AnyResult)
		if err != nil {
			b.Fatal(err)
		}
		obj := valuesObject(64)
		obj["metadata"] = map[string]any{"name": "x", "labels": map[string]any{"a": "1", "b": "2", "app": "3"}}
		a := &Activation{Object: obj}
		b.Run(bc.name+"/tracked", func(b *testing.B) {
			for b.Loop() {
				act, _ := interpreter.NewActivation(a.vars(nil))
				if _, _, err := p.prog.ContextEval(context.Background(), act); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/planned", func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Eval(context.Background(), a); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCostPlanTyped: the plan of a program typed from a schema keeps the
// limit the same way: a few items run untracked, many are stopped, and no
// untracked evaluation is one the tracker would have stopped.
func TestCostPlanTyped(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 10_000})
	scope := Scope{Types: typesFor(t, c)}
	for _, src := range []string{
		"object.spec.ports.map(p, object.spec.ports.filter(q, q.port > p.port).size())",
		"object.spec.ports.all(p, p.name.size() < 10 && object.spec.labels.exists(k, k == p.name))",
		"object.spec.labels.map(k, k + object.spec.labels[k]).size()",
	} {
		p, err := c.Compile(src, scope, AnyResult)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		widget := func(n int) *Activation {
			ports := make([]any, n)
			labels := map[string]any{}
			for i := range ports {
				name := fmt.Sprintf("p%d", i)
				ports[i] = map[string]any{"name": name, "port": int64(i * 7 % 13)}
				labels[name] = name
			}
			return &Activation{Object: map[string]any{"spec": map[string]any{"ports": ports, "labels": labels}}}
		}
		var untracked int
		for n := 1; n <= 60; n++ {
			a := widget(n)
			if !p.cost.untracked(a) {
				continue
			}
			untracked++
			act, err := interpreter.NewActivation(a.vars(p.vt))
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := p.prog.ContextEval(context.Background(), act); err != nil {
				t.Errorf("%s over %d ports ran untracked; tracked: %v", src, n, err)
			}
		}
		if untracked == 0 {
			t.Errorf("%s: never untracked over 1 to 60 ports", src)
		}
		if _, err := p.Eval(context.Background(), widget(2000)); !errors.Is(err, ErrCostLimit) {
			t.Errorf("%s over 2,000 ports: err = %v, want ErrCostLimit", src, err)
		}
	}
}

func BenchmarkCompileCostPlan(b *testing.B) {
	c := newCompiler(b, Options{})
	for _, src := range []string{heavy, "object.metadata.name"} {
		b.Run(strings.Fields(src)[0][:10], func(b *testing.B) {
			for b.Loop() {
				if _, err := c.Compile(src, Scope{}, AnyResult); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
