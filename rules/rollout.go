package rules

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
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
func (d *decoder) decodeRollout(ro *Rollout, n *yaml.Node) {
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
)

// String is how a log line names a rollout's settings.
func (ro Rollout) String() string {
	if ro.Strategy == RolloutImmediate {
		return string(RolloutImmediate)
	}
	return fmt.Sprintf("%s step=%s progressDeadline=%v maxFailures=%d onFailure=%s maxPrunes=%s",
		ro.Strategy, ro.Step, ro.ProgressDeadline, ro.MaxFailures, ro.OnFailure, ro.MaxPrunes)
}
