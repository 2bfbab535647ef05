package rules

import (
	"time"

	"go.yaml.in/yaml/v3"
)

// Decoding how a rule runs: its deletion policy and the defaults its
// resources inherit, its workers, resync, rate limit, retries and history.

// decodeRuleOptions decodes how the rule runs, with their defaults:
// deletionPolicy and adopt (which its resources inherit), forceConflicts,
// workers, resyncPeriod, rateLimit and maxRetries.
func (d *decoder) decodeRuleOptions(r *Rule, f map[string]*yaml.Node) {
	r.DeletionPolicy = DeletionDelete
	if n, ok := f["deletionPolicy"]; ok {
		if v, ok := d.oneOf(n, "spec.deletionPolicy", string(DeletionDelete), string(DeletionOrphan)); ok {
			r.DeletionPolicy = DeletionPolicy(v)
		}
	}
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
		if !res.createOnceSet && res.Mode == ModeOwn {
			res.CreateOnce = createOnce
		}
	}
	d.noteCreateOnce(r)
	r.ForceConflicts = true
	if n, ok := f["forceConflicts"]; ok {
		r.ForceConflicts, _ = d.boolean(n, "spec.forceConflicts")
	}
	r.Workers = DefaultWorkers
	if n, ok := f["workers"]; ok {
		if v, ok := d.integer(n, "spec.workers"); ok {
			if v < 1 || v > maxWorkers {
				d.errorf(n, "spec.workers", "must be between 1 and %d, not %d", maxWorkers, v)
			}
			r.Workers = int(v)
		}
	}
	r.ResyncPeriod = DefaultResyncPeriod
	if n, ok := f["resyncPeriod"]; ok {
		if v, ok := d.duration(n, "spec.resyncPeriod"); ok {
			if v != 0 && v < minResyncPeriod {
				d.errorf(n, "spec.resyncPeriod", "must be 0 (off) or at least %v, not %v", minResyncPeriod, v)
			}
			r.ResyncPeriod = v
		}
	}
	r.RateLimit = RateLimit{BaseDelay: DefaultBaseDelay, MaxDelay: DefaultMaxDelay, QPS: DefaultQPS, Burst: DefaultBurst}
	if n, ok := f["rateLimit"]; ok {
		d.decodeRateLimit(&r.RateLimit, n)
	}
	r.RevisionHistoryLimit = DefaultRevisionHistoryLimit
	if n, ok := f["revisionHistoryLimit"]; ok {
		if v, ok := d.integer(n, "spec.revisionHistoryLimit"); ok {
			if v < 1 || v > maxRevisionHistoryLimit {
				d.errorf(n, "spec.revisionHistoryLimit", "must be between 1 (the revision in force) and %d, not %d", maxRevisionHistoryLimit, v)
			}
			r.RevisionHistoryLimit = int(v)
		}
	}
	r.Rollout = DefaultRollout
	if n, ok := f["rollout"]; ok {
		d.decodeRollout(&r.Rollout, n)
	}
	if n, ok := f["maxRetries"]; ok {
		if v, ok := d.integer(n, "spec.maxRetries"); ok {
			if v < 0 {
				d.errorf(n, "spec.maxRetries", "must be 0 (retry forever) or more, not %d", v)
			}
			r.MaxRetries = int(v)
		}
	}
}

func (d *decoder) decodeRateLimit(rl *RateLimit, n *yaml.Node) {
	const field = "spec.rateLimit"
	f := d.fields(n, field, RuleFormat.known("spec.rateLimit")...)
	if f == nil {
		return
	}
	if nn, ok := f["baseDelay"]; ok {
		if v, ok := d.duration(nn, field+".baseDelay"); ok {
			if v == 0 {
				d.errorf(nn, field+".baseDelay", "must be more than 0")
			}
			rl.BaseDelay = v
		}
	}
	if nn, ok := f["maxDelay"]; ok {
		if v, ok := d.duration(nn, field+".maxDelay"); ok {
			rl.MaxDelay = v
		}
	}
	if rl.MaxDelay < rl.BaseDelay {
		at := n
		if nn, ok := f["maxDelay"]; ok {
			at = nn
		}
		d.errorf(at, field+".maxDelay", "must be at least baseDelay (%v), not %v", rl.BaseDelay, rl.MaxDelay)
	}
	if nn, ok := f["qps"]; ok {
		if v, ok := d.number(nn, field+".qps"); ok {
			if v <= 0 {
				d.errorf(nn, field+".qps", "must be more than 0")
			}
			rl.QPS = v
		}
	}
	if nn, ok := f["burst"]; ok {
		if v, ok := d.integer(nn, field+".burst"); ok {
			if v < 1 {
				d.errorf(nn, field+".burst", "must be at least 1")
			}
			rl.Burst = int(v)
		}
	}
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
