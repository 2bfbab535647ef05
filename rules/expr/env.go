package expr

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"k8s.io/apiserver/pkg/cel/library"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// DefaultCostLimit is the cost one evaluation may spend unless
// Options.CostLimit says otherwise (--cel-cost-limit).
const DefaultCostLimit = 1_000_000

// ErrCostLimit is wrapped by evaluation errors that ran out of cost budget.
var ErrCostLimit = errors.New("CEL cost limit exceeded")

// Names of the variables expressions see.
const (
	varObject    = "object"
	varVariables = "variables"
	varRule      = "rule"
	varItem      = "item"
	varIndex     = "index"
	varChildren  = "children"
	varLookups   = "lookups"
	varReady     = "ready"
	varSelf      = "self"
	varCluster   = "cluster"
	varClusters  = "clusters"
)

// Options configure a Compiler.
type Options struct {
	// CostLimit bounds each evaluation; 0 means DefaultCostLimit.
	CostLimit uint64
}

// Compiler compiles expressions and templates. It is safe for concurrent use.
type Compiler struct {
	lib             *cel.Env // the libraries and no names: parses, and is extended by typed environments
	base            *cel.Env // object, lookups, variables, rule
	forEach         *cel.Env // base + item, index
	children        *cel.Env // base + children (a resource's dependencies)
	forEachChildren *cel.Env // forEach + children
	status          *cel.Env // base + children, ready
	self            *cel.Env // self only (readyWhen)
	costLimit       uint64
	costOpts        []cel.ProgramOption // the tracker's: costOptions

	mu       sync.Mutex
	kinds    map[*spec.Schema]*Type
	selfEnvs map[*Type]typedEnv
}

// NewCompiler builds the CEL environments.
func NewCompiler(opts Options) (*Compiler, error) {
	c := &Compiler{costLimit: opts.CostLimit, kinds: map[*spec.Schema]*Type{}, selfEnvs: map[*Type]typedEnv{}}
	if c.costLimit == 0 {
		c.costLimit = DefaultCostLimit
	}
	lib, err := cel.NewEnv(slices.Concat(libraries(), quantityCalls(), kroLibrary(c.costLimit))...)
	if err != nil {
		return nil, fmt.Errorf("building CEL environment: %w", err)
	}
	guards, err := guardedCalls(lib, c.costLimit)
	if err != nil {
		return nil, fmt.Errorf("building CEL environment: %w", err)
	}
	if c.lib, err = lib.Extend(guards...); err != nil {
		return nil, fmt.Errorf("building CEL environment: %w", err)
	}
	c.costOpts = costOptions(c.lib, c.costLimit)
	base, err := c.lib.Extend(
		cel.Variable(varObject, dynMap),
		cel.Variable(varLookups, dynMap),
		cel.Variable(varVariables, dynMap),
		cel.Variable(varRule, cel.StringType),
		cel.Variable(varCluster, dynMap),
		cel.Variable(varClusters, cel.ListType(dynMap)),
	)
	if err != nil {
		return nil, fmt.Errorf("building CEL environment: %w", err)
	}
	if c.forEach, err = base.Extend(cel.Variable(varItem, cel.DynType), cel.Variable(varIndex, cel.IntType)); err != nil {
		return nil, err
	}
	if c.children, err = base.Extend(cel.Variable(varChildren, dynMap)); err != nil {
		return nil, err
	}
	if c.forEachChildren, err = c.forEach.Extend(cel.Variable(varChildren, dynMap)); err != nil {
		return nil, err
	}
	if c.status, err = c.children.Extend(cel.Variable(varReady, cel.MapType(cel.StringType, cel.BoolType))); err != nil {
		return nil, err
	}
	if c.self, err = c.lib.Extend(cel.Variable(varSelf, dynMap)); err != nil {
		return nil, err
	}
	c.base = base
	return c, nil
}

// libraries are the CEL extensions rules may use: cel-go's strings, lists,
// sets, math, encoders, two-variable comprehensions and optional types, and
// the Kubernetes library of ValidatingAdmissionPolicy (urls, regex, lists,
// quantity, ip, cidr, format, semver) — together +0.8 MB of binary.
func libraries() []cel.EnvOption {
	return []cel.EnvOption{
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Lists(),
		ext.Sets(),
		ext.Math(),
		ext.Encoders(),
		ext.TwoVarComprehensions(),
		library.URLs(),
		library.Regex(),
		library.Lists(),
		library.Quantity(),
		library.IP(),
		library.CIDR(),
		library.Format(),
		library.SemverLib(),
		cel.CrossTypeNumericComparisons(true),
		cel.DefaultUTCTimeZone(true),
	}
}

// env is the environment of scope: one of the compiler's when nothing is
// typed, otherwise the rule's, with the provider of its struct types.
func (c *Compiler) env(scope Scope, dynChildren, dynLookups bool) (*cel.Env, *provider, error) {
	if scope.typed() {
		if scope.Self {
			return c.selfEnv(scope.SelfType)
		}
		ts := scope.Types
		if ts == nil {
			ts = &Types{}
		}
		return ts.env(c, envKey{item: scope.Item, dynChildren: dynChildren, dynLookups: dynLookups})
	}
	switch {
	case scope.Self:
		return c.self, nil, nil
	case scope.Status:
		return c.status, nil, nil
	case scope.ForEach && scope.Children != nil:
		return c.forEachChildren, nil, nil
	case scope.ForEach:
		return c.forEach, nil, nil
	case scope.Children != nil:
		return c.children, nil, nil
	}
	return c.base, nil, nil
}
