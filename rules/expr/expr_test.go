package expr

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func newCompiler(t testing.TB, opts Options) *Compiler {
	t.Helper()
	c, err := NewCompiler(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCompileErrors(t *testing.T) {
	c := newCompiler(t, Options{})
	tests := []struct {
		name       string
		src        string
		scope      Scope
		want       Result
		wantMsg    string
		wantOffset int
	}{
		{"undeclared identifier", "objet.metadata.name == 'x'", Scope{}, BoolResult, "undeclared reference to 'objet'", 0},
		{"syntax error", "object.metadata.name ==", Scope{}, BoolResult, "Syntax error", 23},
		{"unknown variable", "variables.tire == 'gold'", Scope{Variables: []string{"tier"}}, BoolResult,
			`undeclared variable "tire" (declared: tier)`, 10},
		{"unknown variable by index", "object.x == variables['nope']", Scope{}, BoolResult,
			`undeclared variable "nope" (no variables are declared here)`, 23},
		{"unknown variable in has", "has(variables.nope)", Scope{Variables: []string{"a", "b"}}, BoolResult,
			`undeclared variable "nope" (declared: a, b)`, 14},
		{"item outside forEach", "item == 'x'", Scope{}, BoolResult, "undeclared reference to 'item'", 0},
		{"children outside status", "children.quota", Scope{}, AnyResult, "undeclared reference to 'children'", 0},
		{"cluster outside clusters", "object.a == cluster.name", Scope{}, BoolResult, "cluster is known in a resource that targets clusters", 12},
		{"unknown child id", "has(children.qouta.status)", Scope{Children: []string{"quota"}}, AnyResult,
			`undeclared resource id "qouta" (declared: quota)`, 13},
		{"when not bool", "'yes'", Scope{}, BoolResult, "must produce a bool, but produces string", -1},
		{"forEach not list", "{'a': 1}", Scope{}, ListResult, "must produce a list, but produces map(string, int)", -1},
		{"empty", "  ", Scope{}, BoolResult, "empty expression", -1},
		{"second line", "object.a == 1 &&\n  nope", Scope{}, BoolResult, "undeclared reference to 'nope'", 19},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantCompileError(t, c, tt.src, tt.scope, tt.want, tt.wantMsg, tt.wantOffset)
		})
	}
}

// wantCompileError compiles src and wants an *Error holding msg at offset.
func wantCompileError(t *testing.T, c *Compiler, src string, scope Scope, want Result, msg string, offset int) {
	t.Helper()
	_, err := c.Compile(src, scope, want)
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("Compile(%q) error = %v, want *Error", src, err)
	}
	if !strings.Contains(ce.Msg, msg) {
		t.Errorf("message %q does not contain %q", ce.Msg, msg)
	}
	if ce.Offset != offset {
		t.Errorf("offset = %d, want %d", ce.Offset, offset)
	}
}

func TestCompileAccepts(t *testing.T) {
	c := newCompiler(t, Options{})
	for _, tt := range []struct {
		src   string
		scope Scope
		want  Result
	}{
		{"object.metadata.labels.tenant != 'system'", Scope{}, BoolResult},
		{"object.metadata.labels.?tier.orValue('bronze')", Scope{}, AnyResult},
		{"variables.tier == 'gold'", Scope{Variables: []string{"tier"}}, BoolResult},
		{"object.spec.enabled", Scope{}, BoolResult}, // dyn: checked when evaluated
		{"object.metadata.annotations.?teams.orValue('').split(',').filter(t, t != '')", Scope{}, ListResult},
		{"item + '-' + string(index)", Scope{ForEach: true}, AnyResult},
		{"has(children.quota.status.hard)", Scope{Children: []string{"quota"}}, AnyResult},
		{"rule + '.' + object.metadata.name", Scope{}, StringResult},
		{"cluster.labels.env == 'prod' && cluster.name != object.metadata.name", Scope{Cluster: true}, BoolResult},
		{"cluster.name + '-' + item", Scope{Cluster: true, ForEach: true}, StringResult},
		{"sets.contains([1, 2], [1])", Scope{}, BoolResult},
		{"math.greatest(1, 2) == 2", Scope{}, BoolResult},
		{"base64.encode(b'hi')", Scope{}, AnyResult},
		{"[1, 2].all(i, v, v > i)", Scope{}, BoolResult},
		{"'a,b'.split(',').sortBy(s, s)", Scope{}, ListResult},
		{"quantity('1Gi').isGreaterThan(quantity('500Mi'))", Scope{}, BoolResult},
	} {
		if _, err := c.Compile(tt.src, tt.scope, tt.want); err != nil {
			t.Errorf("Compile(%q): %v", tt.src, err)
		}
	}
}

func TestEval(t *testing.T) {
	c := newCompiler(t, Options{})
	act := &Activation{
		Object: map[string]any{
			"metadata": map[string]any{"name": "team-a", "labels": map[string]any{"tier": "gold"}},
			"spec":     map[string]any{"replicas": int64(3), "ratio": 0.5, "enabled": "yes"},
		},
		Variables: map[string]any{"tier": "gold"},
		Rule:      "r",
	}
	tests := []struct {
		src  string
		want any
	}{
		{"object.metadata.name", "team-a"},
		{"object.spec.replicas * 2", int64(6)},
		{"object.spec.ratio", 0.5},
		{"variables.tier == 'gold'", true},
		{"{'a': [1, 'x', null]}", map[string]any{"a": []any{int64(1), "x", nil}}},
		{"object.metadata.labels.?missing", nil},
		{"object.metadata.labels.?tier", "gold"},
		{"b'hi'", "aGk="},
		{"timestamp('2026-01-02T03:04:05Z')", "2026-01-02T03:04:05Z"},
		{"duration('90s')", "1m30s"},
		{"2u", int64(2)},
		{"rule", "r"},
	}
	for _, tt := range tests {
		p, err := c.Compile(tt.src, Scope{Variables: []string{"tier"}}, AnyResult)
		if err != nil {
			t.Fatalf("Compile(%q): %v", tt.src, err)
		}
		got, err := p.Eval(context.Background(), act)
		if err != nil {
			t.Fatalf("Eval(%q): %v", tt.src, err)
		}
		if !equal(got, tt.want) {
			t.Errorf("Eval(%q) = %#v, want %#v", tt.src, got, tt.want)
		}
	}

	p, err := c.Compile("object.spec.enabled", Scope{}, BoolResult)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.EvalBool(context.Background(), act); err == nil || !strings.Contains(err.Error(), "must produce a bool") {
		t.Errorf("EvalBool of a string: err = %v, want 'must produce a bool'", err)
	}
	p, err = c.Compile("object.metadata.nope", Scope{}, AnyResult)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Eval(context.Background(), act); err == nil || !strings.Contains(err.Error(), "no such key: nope") {
		t.Errorf("Eval of a missing key: err = %v, want 'no such key'", err)
	}
}

func TestKubernetesLibrary(t *testing.T) {
	c := newCompiler(t, Options{})
	for src, want := range map[string]any{
		"quantity('1Gi').isGreaterThan(quantity('500Mi'))":       true,
		"quantity('1500m').asApproximateFloat()":                 1.5,
		"url('https://example.com:8443/x').getPort()":            "8443",
		"'img-123-abc'.find('[0-9]+')":                           "123",
		"ip('10.0.0.1').family()":                                int64(4),
		"cidr('10.0.0.0/8').containsIP('10.1.2.3')":              true,
		"[1, 2, 3].isSorted() && [3, 1].sum() == 4":              true,
		"format.dns1123Label().validate('Bad_Name').hasValue()":  true,
		"semver('1.2.3').isGreaterThan(semver('1.0.0'))":         true,
		"'a.b'.matches('^[a-z.]+$') && !'A'.matches('^[a-z]+$')": true,
	} {
		p, err := c.Compile(src, Scope{}, AnyResult)
		if err != nil {
			t.Errorf("Compile(%q): %v", src, err)
			continue
		}
		got, err := p.Eval(context.Background(), &Activation{})
		if err != nil || got != want {
			t.Errorf("Eval(%q) = %#v, %v; want %#v", src, got, err, want)
		}
	}
	// Kubernetes functions count toward the cost limit: a regex over a long
	// string is not free.
	small := newCompiler(t, Options{CostLimit: 1000})
	p, err := small.Compile("object.s.find('[0-9]+$')", Scope{}, AnyResult)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 200_000) + "1"
	if _, err := p.Eval(context.Background(), &Activation{Object: map[string]any{"s": long}}); !errors.Is(err, ErrCostLimit) {
		t.Errorf("regex over 200 kB with limit 1000: err = %v, want ErrCostLimit", err)
	}
}

func TestCostLimit(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 10_000})
	bomb := "[1,2,3,4,5,6,7,8,9,10].map(a, [1,2,3,4,5,6,7,8,9,10].map(b, [1,2,3,4,5,6,7,8,9,10].map(c, a*b*c))).size() > 0"
	p, err := c.Compile(bomb, Scope{}, BoolResult)
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.EvalBool(context.Background(), &Activation{})
	if !errors.Is(err, ErrCostLimit) {
		t.Fatalf("err = %v, want ErrCostLimit", err)
	}
	// The same expression within a larger budget succeeds: the limit, not
	// the expression, stopped it.
	big := newCompiler(t, Options{CostLimit: 1_000_000})
	p, err = big.Compile(bomb, Scope{}, BoolResult)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := p.EvalBool(context.Background(), &Activation{}); err != nil || !ok {
		t.Fatalf("within budget: %v, %v", ok, err)
	}
}

func TestEvalCancelled(t *testing.T) {
	c := newCompiler(t, Options{CostLimit: 1 << 62})
	p, err := c.Compile("lists.range(1000).map(a, lists.range(1000).map(b, a*b)).size() > 0", Scope{}, BoolResult)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.EvalBool(ctx, &Activation{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("evaluation with a cancelled context: err = %v, want context.Canceled", err)
	}
}

func equal(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, v := range a {
			if !equal(v, bm[k]) {
				return false
			}
		}
		return true
	case []any:
		bl, ok := b.([]any)
		if !ok || len(a) != len(bl) {
			return false
		}
		for i := range a {
			if !equal(a[i], bl[i]) {
				return false
			}
		}
		return true
	}
	return a == b
}

func TestEvalCluster(t *testing.T) {
	c := newCompiler(t, Options{})
	p, err := c.Compile("cluster.labels.env == 'prod' ? cluster.name : 'none'", Scope{Cluster: true}, AnyResult)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		cluster map[string]any
		want    any
	}{
		{map[string]any{"name": "eu-1", "labels": map[string]any{"env": "prod"}}, "eu-1"},
		{map[string]any{"name": "dev-1", "labels": map[string]any{"env": "dev"}}, "none"},
	} {
		got, err := p.Eval(context.Background(), &Activation{Cluster: tt.cluster})
		if err != nil || got != tt.want {
			t.Errorf("cluster %v: got %v, %v; want %v", tt.cluster, got, err, tt.want)
		}
	}
}
