package rules

import (
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/syncloop/syncloop/rules/expr"
)

// Decoding how a rule runs: its deletion policy and the defaults its
// resources inherit, its workers, resync, rate limit, retries and history.

// decodeRuleOptions decodes how the rule runs, with their defaults:
// deletionPolicy and adopt (which its resources inherit), forceConflicts,
// workers, resyncPeriod, rateLimit and maxRetries.
func (d *decoder) decodeRuleOptions(r *Rule, f map[string]*yaml.Node, c *expr.Compiler) {
	r.DeletionPolicy = DeletionDelete
	decodeOneOf(d, f, "spec", "deletionPolicy", &r.DeletionPolicy, DeletionDelete, DeletionOrphan)
	adopt, createOnce := false, false
	if n, ok := f["adopt"]; ok {
		adopt, _ = d.boolean(n, "spec.adopt")
	}
	if n, ok := f["createOnce"]; ok {
		createOnce, _ = d.boolean(n, "spec.createOnce")
	}
	for _, res := range r.Resources {
		if res.DeletionPolicy == "" {
			res.DeletionPolicy = r.DeletionPolicy
		}
		if !res.adoptSet && res.Mode == ModeOwn {
			res.Adopt = adopt
		}
		if !res.createOnceSet && res.Mode == ModeOwn && res.Clusters == nil { // in other clusters: kept, not made once
			res.CreateOnce = createOnce
		}
	}
	d.noteCreateOnce(r)
	r.ForceConflicts = true
	if n, ok := f["forceConflicts"]; ok {
		r.ForceConflicts, _ = d.boolean(n, "spec.forceConflicts")
	}
	r.Workers = DefaultWorkers
	decodeInto(d, f, "spec", "workers", &r.Workers, d.count, func(v int) string {
		return failIf(v < 1 || v > maxWorkers, "must be between 1 and %d, not %d", maxWorkers, v)
	})
	r.ResyncPeriod = DefaultResyncPeriod
	decodeInto(d, f, "spec", "resyncPeriod", &r.ResyncPeriod, d.duration, func(v time.Duration) string {
		return failIf(v != 0 && v < minResyncPeriod, "must be 0 (off) or at least %v, not %v", minResyncPeriod, v)
	})
	r.RateLimit = RateLimit{BaseDelay: DefaultBaseDelay, MaxDelay: DefaultMaxDelay, QPS: DefaultQPS, Burst: DefaultBurst}
	if n, ok := f["rateLimit"]; ok {
		d.decodeRateLimit(&r.RateLimit, n)
	}
	r.RevisionHistoryLimit = DefaultRevisionHistoryLimit
	decodeInto(d, f, "spec", "revisionHistoryLimit", &r.RevisionHistoryLimit, d.count, func(v int) string {
		return failIf(v < 1 || v > maxRevisionHistoryLimit, "must be between 1 (the revision in force) and %d, not %d", maxRevisionHistoryLimit, v)
	})
	r.Rollout = DefaultRollout
	if n, ok := f["rollout"]; ok {
		d.decodeRollout(&r.Rollout, n, c)
		d.checkClusterRollout(r, n)
	}
	decodeInto(d, f, "spec", "maxRetries", &r.MaxRetries, d.count, func(v int) string {
		return failIf(v < 0, "must be 0 (retry forever) or more, not %d", v)
	})
}

func (d *decoder) decodeRateLimit(rl *RateLimit, n *yaml.Node) {
	const field = "spec.rateLimit"
	f := d.fields(n, field, RuleFormat.known("spec.rateLimit")...)
	if f == nil {
		return
	}
	decodeInto(d, f, field, "baseDelay", &rl.BaseDelay, d.duration, func(v time.Duration) string {
		return failIf(v == 0, "must be more than 0")
	})
	decodeInto(d, f, field, "maxDelay", &rl.MaxDelay, d.duration, nil)
	if rl.MaxDelay < rl.BaseDelay {
		at := n
		if nn, ok := f["maxDelay"]; ok {
			at = nn
		}
		d.errorf(at, field+".maxDelay", "must be at least baseDelay (%v), not %v", rl.BaseDelay, rl.MaxDelay)
	}
	decodeInto(d, f, field, "qps", &rl.QPS, d.number, func(v float64) string {
		return failIf(v <= 0, "must be more than 0")
	})
	decodeInto(d, f, field, "burst", &rl.Burst, d.count, func(v int) string {
		return failIf(v < 1, "must be at least 1")
	})
}

func (d *decoder) duration(n *yaml.Node, field string) (time.Duration, bool) {
	s, ok := d.str(n, field)
	if !ok {
		return 0, false
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.errorf(n, field, "%q is not a duration (like 30s, 10m, 1h)", s)
		return 0, false
	}
	if v < 0 {
		d.errorf(n, field, "must not be negative")
		return 0, false
	}
	return v, true
}
