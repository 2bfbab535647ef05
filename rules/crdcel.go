package rules

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	apicel "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
)

// The x-kubernetes-validations of a kind's schema, compiled and held to
// the API server's limits as it holds them when the CRD is applied: each
// rule's estimated cost times how often it may run, all of them together,
// and oldSelf (immutable=true) only where old and new values correlate.

// staticCostLimit is the estimated cost the API server allows one
// x-kubernetes-validations rule (apiextensions' StaticEstimatedCostLimit),
// and staticCRDCostLimit all of a CRD's together
// (StaticEstimatedCRDCostLimit).
const (
	staticCostLimit    = 10_000_000
	staticCRDCostLimit = 100_000_000
)

var celLocation = regexp.MustCompile(`<input>:(\d+):(\d+): `)

// celCost adds up the estimated costs of a kind's validations, as the
// API server does to hold them all to staticCRDCostLimit.
type celCost struct {
	sum       uint64
	worst     string // the field whose validation costs the most
	worstCost uint64
}

func (c *celCost) add(path string, cost uint64) {
	c.sum = addWithOverflowGuard(c.sum, cost)
	if cost > c.worstCost {
		c.worst, c.worstCost = path, cost
	}
}

// celScope is where in a kind's schema a validation is, as the API
// server weighs it: how many times the value it checks may occur in one
// object (card, nil without bound: 1 for a field of spec, maxItems or
// maxProperties times more under each list or map), the list above whose
// items old and new values do not correlate (uncorrelated; oldSelf
// cannot be used there), and the kind's total cost so far.
type celScope struct {
	card         *uint64
	uncorrelated string
	total        *celCost
}

// child is the scope of a field, item or map value of s, s being in c:
// a field of an object occurs as often as the object, an item or value
// maxItems or maxProperties times as often, without bound when the list
// or map has none; an item of a list not of listType=map is not
// correlated with an old item.
func (c celScope) child(s *structuralschema.Structural, path string) celScope {
	out := c
	var bound *int64
	switch {
	case s.Type == "array":
		if s.ValueValidation != nil {
			bound = s.ValueValidation.MaxItems
		}
		if (s.XListType == nil || *s.XListType != "map") && out.uncorrelated == "" {
			out.uncorrelated = path
		}
	case s.Type == "object" && s.AdditionalProperties != nil:
		if s.ValueValidation != nil {
			bound = s.ValueValidation.MaxProperties
		}
	default:
		return out
	}
	if bound == nil || c.card == nil {
		out.card = nil
	} else {
		out.card = ptr.To(multiplyWithOverflowGuard(*c.card, uint64(max(0, *bound))))
	}
	return out
}

// expressionCost is what the API server estimates one run of a rule over
// every value it checks costs: its own cost times how many times the
// value may occur (card), or, without bound, as many as fit in a request.
func expressionCost(res apicel.CompilationResult, card *uint64) uint64 {
	if card != nil {
		return multiplyWithOverflowGuard(res.MaxCost, *card)
	}
	return multiplyWithOverflowGuard(res.MaxCost, res.MaxCardinality)
}

func multiplyWithOverflowGuard(a, b uint64) uint64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxUint64/b {
		return math.MaxUint64
	}
	return a * b
}

func addWithOverflowGuard(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// checkValidations compiles the kind's validations — spec's, the rules
// of spec.api.validations (validations), and those of markers — and
// holds them to the API server's limits.
func (d *decoder) checkValidations(a *Version, spec *structuralschema.Structural) {
	errsBefore := len(d.errs)
	total := &celCost{}
	d.compileValidations(a, spec, "spec", a.validations, celScope{card: ptr.To[uint64](1), total: total})
	if total.sum > staticCRDCostLimit && len(d.errs) == errsBefore {
		d.errorAt(a.FieldPos(total.worst), a.field, "the kind's validations together may cost %d, more than the API server allows one kind (%d), most of it %s's: bound the lists, maps and strings they read with maxItems, maxProperties or maxLength",
			total.sum, staticCRDCostLimit, total.worst)
	}
}

// compileValidations compiles the x-kubernetes-validations of s, at path
// in the object and in scope, and of its fields.
func (d *decoder) compileValidations(a *Version, s *structuralschema.Structural, path string, validations []*yaml.Node, scope celScope) {
	if len(s.XValidations) > 0 {
		results, err := apicel.Compile(s, model.SchemaDeclType(s, false), celconfig.PerCallLimit,
			environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()), apicel.NewExpressionsEnvLoader())
		if err != nil {
			d.errorAt(a.FieldPos(path), a.field, "%s: the validations do not compile: %v", path, err)
			return
		}
		for i, res := range results {
			// The spec's own are spec.api.validations; others are markers.
			var node *yaml.Node
			field := a.field + "." + path
			if path == "spec" && i < len(validations) {
				node, field = validations[i], fmt.Sprintf("%s.validations[%d].rule", a.field, i)
			}
			d.checkCompiled(a, res, path, field, node, scope)
		}
	}
	inner := scope.child(s, path)
	eachChild(s, path, func(c *structuralschema.Structural, at string) { d.compileValidations(a, c, at, nil, inner) })
}

// eachChild calls f with each schema below s — its fields (at path.name,
// in order), its items and its map values (at path) — as the API server
// walks a schema to check it.
func eachChild(s *structuralschema.Structural, path string, f func(c *structuralschema.Structural, at string)) {
	for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
		p := s.Properties[name]
		f(&p, path+"."+name)
	}
	if s.Items != nil {
		f(s.Items, path)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Structural != nil {
		f(s.AdditionalProperties.Structural, path)
	}
}

// checkCompiled reports what is wrong with one compiled validation of
// the field at path (field names it for errors; node is its rule's, nil
// for a marker's) and adds its cost to the scope's total.
func (d *decoder) checkCompiled(a *Version, res apicel.CompilationResult, path, field string, node *yaml.Node, scope celScope) {
	at := func(detail string) Pos {
		if node == nil {
			return a.FieldPos(path)
		}
		p := d.pos(node)
		if m := celLocation.FindStringSubmatch(detail); m != nil {
			line, _ := strconv.Atoi(m[1])
			col, _ := strconv.Atoi(m[2])
			if line == 1 {
				p = d.offsetPos(node, col)
			}
		}
		return p
	}
	messageField := strings.TrimSuffix(field, ".rule") + ".messageExpression"
	cost := expressionCost(res, scope.card)
	switch {
	case res.Error != nil:
		d.errorAt(at(res.Error.Detail), field, "%s", celDetail(res.Error.Detail))
	case res.MessageExpressionError != nil:
		d.errorAt(at(""), messageField, "%s", celDetail(res.MessageExpressionError.Detail))
	case res.UsesOldSelf && scope.uncorrelated != "":
		d.errorAt(at(""), field, "oldSelf (immutable=true) compares a value with its old one, which the API server cannot find for an item of %s, a list not of listType=map: make the list immutable, or a listType=map", scope.uncorrelated)
	case cost > staticCostLimit:
		d.errorAt(at(""), field, "the rule may cost %d, more than the API server allows one rule (%d)%s: bound the lists, maps and strings it reads with maxItems, maxProperties or maxLength",
			cost, staticCostLimit, checkedTimes(scope.card))
	case res.MessageExpressionMaxCost > staticCostLimit:
		d.errorAt(at(""), messageField, "the message may cost %d, more than the API server allows one (%d): bound the lists, maps and strings it reads with maxItems, maxProperties or maxLength",
			res.MessageExpressionMaxCost, staticCostLimit)
	}
	scope.total.add(path, addWithOverflowGuard(cost, res.MessageExpressionMaxCost))
}

// checkedTimes says, for a cost error, how often the rule runs: "" once.
func checkedTimes(card *uint64) string {
	switch {
	case card == nil:
		return ", checked on every value of a list or map without maxItems or maxProperties"
	case *card > 1:
		return fmt.Sprintf(", checked on up to %d values", *card)
	}
	return ""
}

// celDetail is the API server's compile error, its "<input>:1:5:" and
// source excerpt dropped: the error's position says where.
func celDetail(detail string) string {
	detail = celLocation.ReplaceAllString(detail, "")
	if i := strings.Index(detail, "\n"); i >= 0 {
		detail = detail[:i]
	}
	return strings.TrimPrefix(strings.TrimPrefix(detail, "compilation failed: "), "ERROR: ")
}
