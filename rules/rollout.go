package rules

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/syncloop/syncloop/rules/expr"
)

// RolloutStrategy says how a changed rule reaches the triggers it already
// has.
type RolloutStrategy string

const (
	// RolloutProgressive moves the triggers to the new revision in steps,
	// each once the one before it is healthy (the default).
	RolloutProgressive RolloutStrategy = "Progressive"
	// RolloutImmediate moves every trigger at once.
	RolloutImmediate RolloutStrategy = "Immediate"
)

// RolloutFailure says what a rollout does when a step fails.
type RolloutFailure string

const (
	// RolloutHalt stops where it is until the rule changes again.
	RolloutHalt RolloutFailure = "Halt"
	// RolloutRollback moves the triggers moved so far back to the
	// revision they came from.
	RolloutRollback RolloutFailure = "Rollback"
)

// Amount is a count of triggers or children: a number, or a percent of a
// total.
type Amount struct {
	Value   int
	Percent bool
}

// Of is the amount out of total: a percent rounded up.
func (a Amount) Of(total int) int {
	if !a.Percent {
		return a.Value
	}
	return (total*a.Value + 99) / 100
}

func (a Amount) String() string {
	if a.Percent {
		return strconv.Itoa(a.Value) + "%"
	}
	return strconv.Itoa(a.Value)
}

// Rollout says how a change of the rule rolls out over its triggers
// (spec.rollout). It is not part of the rule's revision: changing it —
// raising maxPrunes to confirm a removal — changes how the rollout under
// way goes on, not what the rule does.
type Rollout struct {
	Strategy RolloutStrategy
	// Step is how many triggers each step moves (a percent of the
	// triggers there when the rollout started), at least 1.
	Step Amount
	// ProgressDeadline bounds how long a step's triggers may take to be
	// healthy: those that are not by then have failed.
	ProgressDeadline time.Duration
	// MaxFailures is how many failed triggers a step may have and the
	// rollout still go on.
	MaxFailures int
	OnFailure   RolloutFailure
	// MaxPrunes is how many of the rule's children (a percent of those
	// there when the rollout started) the rollout may remove in all
	// before it halts for confirmation.
	MaxPrunes Amount
	// Clusters, when set, steps the rollout by cluster instead of by
	// trigger: every trigger moves at once, and the new revision reaches
	// the clusters of the fleet in these steps, in order — a cluster in
	// the first step whose selector holds for it, the others in a last
	// step — each once the clusters before are healthy.
	Clusters []*Expression
}

// Equal reports whether ro and o say the same (the steps by their source).
func (ro Rollout) Equal(o Rollout) bool {
	return ro.Strategy == o.Strategy && ro.Step == o.Step && ro.ProgressDeadline == o.ProgressDeadline &&
		ro.MaxFailures == o.MaxFailures && ro.OnFailure == o.OnFailure && ro.MaxPrunes == o.MaxPrunes &&
		slices.EqualFunc(ro.Clusters, o.Clusters, func(x, y *Expression) bool { return x.Source() == y.Source() })
}

// ByCluster reports whether the rollout steps by cluster.
func (ro Rollout) ByCluster() bool { return ro.Strategy == RolloutProgressive && len(ro.Clusters) > 0 }

// ClusterStep is the step of a rollout by cluster that reaches c: the
// index of the first step whose selector holds for it, len(Clusters) (the
// last) when none does. A selector that fails for c does not hold.
func (ro Rollout) ClusterStep(ctx context.Context, c Cluster) int {
	act := expr.Activation{Cluster: c.Value()}
	for i, sel := range ro.Clusters {
		if ok, err := sel.EvalBool(ctx, &act); err == nil && ok {
			return i
		}
	}
	return len(ro.Clusters)
}

// DefaultRollout is a rule's spec.rollout when it says nothing.
var DefaultRollout = Rollout{
	Strategy:         RolloutProgressive,
	Step:             Amount{Value: 10, Percent: true},
	ProgressDeadline: 5 * time.Minute,
	OnFailure:        RolloutHalt,
	MaxPrunes:        Amount{Value: 10, Percent: true},
}

// decodeRollout decodes spec.rollout over its defaults.
func (d *decoder) decodeRollout(ro *Rollout, n *yaml.Node, c *expr.Compiler) {
	const field = "spec.rollout"
	f := d.fields(n, field, RuleFormat.known(field)...)
	if f == nil {
		return
	}
	decodeOneOf(d, f, field, "strategy", &ro.Strategy, RolloutProgressive, RolloutImmediate)
	decodeInto(d, f, field, "step", &ro.Step, d.amount, func(v Amount) string {
		return failIf(v.Value < 1, "must be at least 1 (or 1%%), not %s", v)
	})
	decodeInto(d, f, field, "progressDeadline", &ro.ProgressDeadline, d.duration, func(v time.Duration) string {
		return failIf(v < time.Second, "must be at least 1s, not %v", v)
	})
	decodeInto(d, f, field, "maxFailures", &ro.MaxFailures, d.count, func(v int) string {
		return failIf(v < 0, "must be 0 or more, not %d", v)
	})
	decodeOneOf(d, f, field, "onFailure", &ro.OnFailure, RolloutHalt, RolloutRollback)
	decodeInto(d, f, field, "maxPrunes", &ro.MaxPrunes, d.amount, func(v Amount) string {
		return failIf(v.Value < 0, "must be 0 or more, not %s", v)
	})
	if cn, ok := f["clusters"]; ok {
		for i, sn := range d.seq(cn, field+".clusters") {
			sf := d.fields(sn, fmt.Sprintf("%s.clusters[%d]", field, i), "selector")
			if sel, ok := sf["selector"]; ok {
				ro.Clusters = append(ro.Clusters, d.expression(sel, fmt.Sprintf("%s.clusters[%d].selector", field, i), c,
					expr.Scope{Cluster: true, ClusterOnly: true}, expr.BoolResult))
			} else if sf != nil {
				d.errorf(sn, fmt.Sprintf("%s.clusters[%d].selector", field, i), "required: CEL over cluster.name and cluster.labels")
			}
		}
		if len(ro.Clusters) == 0 {
			d.errorf(cn, field+".clusters", "must list at least one step")
		}
	}
}

// checkClusterRollout reports a rollout by cluster of a rule that cannot
// step by cluster.
func (d *decoder) checkClusterRollout(r *Rule, n *yaml.Node) {
	switch {
	case len(r.Rollout.Clusters) == 0:
	case !r.TargetsClusters():
		d.errorf(n, "spec.rollout.clusters", "steps by cluster, and no resource of the rule targets clusters (clusters:)")
	case r.Rollout.Strategy == RolloutImmediate:
		d.errorf(n, "spec.rollout.clusters", "steps by cluster, and strategy Immediate takes no steps: leave one of them out")
	case slices.Contains(r.Rollout.Clusters, nil):
		r.Rollout.Clusters = nil // a step that does not compile: reported
	}
}

// amount decodes a number, or a percent as a string ("10%", up to 100%).
func (d *decoder) amount(n *yaml.Node, field string) (Amount, bool) {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int" {
		v, ok := d.integer(n, field)
		return Amount{Value: int(v)}, ok
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
		if p, ok := strings.CutSuffix(n.Value, "%"); ok {
			v, err := strconv.Atoi(p)
			if err == nil && v >= 0 && v <= 100 {
				return Amount{Value: v, Percent: true}, true
			}
		}
	}
	d.errorf(n, field, "must be a number or a percent from 0%% to 100%% (like 10%%), not %s", describeScalar(n))
	return Amount{}, false
}

// rolloutFormat is spec.rollout.
var rolloutFormat = fieldObj("rollout", "How a change of the rule reaches the triggers it already has: in steps gated by their health (default), or at once.",
	&Field{Name: "strategy", Type: "string", Enum: []string{string(RolloutProgressive), string(RolloutImmediate)},
		Desc: "Progressive (default): the triggers move to the new revision step by step, each step once the one before is healthy; Immediate: all at once."},
	fieldAmount("step", "Triggers moved per step: a number, or a percent of the triggers there when the rollout started (default 10%; at least 1)."),
	fieldStr("progressDeadline", "How long a step's triggers may take to be healthy, a Go duration (default 5m): those that are not have failed."),
	&Field{Name: "maxFailures", Type: "integer", Desc: "Failed triggers a step may have and the rollout still go on (default 0)."},
	&Field{Name: "onFailure", Type: "string", Enum: []string{string(RolloutHalt), string(RolloutRollback)},
		Desc: "Halt (default): the rollout stops where it is until the rule changes again; Rollback: the moved triggers go back to the previous revision."},
	fieldAmount("maxPrunes", "Children the rollout may remove in all before it halts for confirmation: a number, or a percent of the rule's children when it started (default 10%; 100% confirms any removal)."),
	fieldList("clusters", "Step by cluster instead of by trigger (a rule whose resources target clusters): every trigger moves at once, and the new revision reaches the clusters of the fleet step by step, in this order, each step once the children in the clusters before are ready; a cluster no step selects comes last. Until its step, a cluster's children stay as they are.",
		fieldObj("", "A step: the clusters its selector holds for (and no earlier step's).",
			must(fieldCEL("selector", "Which clusters, over cluster.name and cluster.labels alone")))),
)

// String is how a log line names a rollout's settings.
func (ro Rollout) String() string {
	if ro.Strategy == RolloutImmediate {
		return string(RolloutImmediate)
	}
	s := fmt.Sprintf("%s step=%s progressDeadline=%v maxFailures=%d onFailure=%s maxPrunes=%s",
		ro.Strategy, ro.Step, ro.ProgressDeadline, ro.MaxFailures, ro.OnFailure, ro.MaxPrunes)
	if len(ro.Clusters) > 0 {
		s += fmt.Sprintf(" clusters=%d steps", len(ro.Clusters)+1)
	}
	return s
}
