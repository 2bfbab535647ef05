package rollout

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// counts are the triggers there when the rollout began, and how many of
// them it has moved. Called with c.mu held.
func (c *Coordinator) counts() (total, moved int) {
	c.eachTrigger(func(t Trigger) {
		if t.existing(c.rec.Started) {
			total++
			if t.Digest < c.rec.Threshold {
				moved++
			}
		}
	})
	return total, moved
}

// stepKeys are the cached triggers whose digests are in [lo, hi). Called
// with c.mu held.
func (c *Coordinator) stepKeys(lo, hi uint64) map[cache.ObjectName]bool {
	out := map[cache.ObjectName]bool{}
	c.eachTrigger(func(t Trigger) {
		if t.Digest >= lo && t.Digest < hi {
			out[t.Key] = true
		}
	})
	return out
}

// waiting are the triggers still on the previous revision that were there
// when the rollout began, in rollout order.
func (c *Coordinator) waiting(rec Record) []Trigger {
	var out []Trigger
	c.eachTrigger(func(t Trigger) {
		if t.existing(rec.Started) && t.Digest >= rec.Threshold {
			out = append(out, t)
		}
	})
	slices.SortFunc(out, func(a, b Trigger) int { return cmp.Compare(a.Digest, b.Digest) })
	return out
}

// keys are the keys of triggers.
func keys(triggers []Trigger) []cache.ObjectName {
	out := make([]cache.ObjectName, len(triggers))
	for i, t := range triggers {
		out[i] = t.Key
	}
	return out
}

// next begins the next step: the next triggers in rollout order move to
// the new revision — unless what the change would remove so far passes
// maxPrunes, when the rollout halts and says how much it would remove in
// all — or, when none is left, the rollout is complete.
func (c *Coordinator) next(ctx context.Context) {
	s := *c.settings.Load()
	if s.ByCluster() {
		c.nextClusters(ctx, s)
		return
	}
	rec := c.Record()
	left := c.waiting(rec)
	if len(left) == 0 {
		c.complete(ctx)
		return
	}
	size := max(1, s.Step.Of(rec.Total))
	batch := left[:min(size, len(left))]
	prunes := c.host.Prunes(ctx, keys(batch))
	if budget := s.MaxPrunes.Of(rec.Children); prunes > 0 && rec.Pruned+prunes > budget {
		all := rec.Pruned + c.host.Prunes(ctx, keys(left))
		c.halt(ctx, ReasonPruneBudget, fmt.Sprintf(
			"the change removes %d of the rule's %d children in all (%d so far), more than maxPrunes %s allows (%d): to confirm, raise spec.rollout.maxPrunes (100%% allows any removal)",
			all, rec.Children, rec.Pruned, s.MaxPrunes, budget))
		return
	}
	threshold := uint64(math.MaxUint64)
	if len(batch) < len(left) {
		threshold = left[len(batch)].Digest
	}
	c.mu.Lock()
	c.rec.StepFrom, c.rec.Threshold = c.rec.Threshold, threshold
	c.rec.Step++
	c.rec.Steps = c.rec.Step + (len(left)-len(batch)+size-1)/size
	c.rec.Moved += len(batch)
	c.rec.Pruned += prunes
	c.rec.StepStarted = time.Now()
	c.step = map[cache.ObjectName]bool{}
	for _, t := range batch {
		c.step[t.Key] = true
		delete(c.health, t.Key)
	}
	rec = c.rec
	c.mu.Unlock()
	msg := fmt.Sprintf("step %d of %d: %d triggers move to revision %s (%d of %d moved)", rec.Step, rec.Steps, len(batch), Short(rec.To), rec.Moved, rec.Total)
	if prunes > 0 {
		msg += fmt.Sprintf("; it removes %d children (%d in all so far)", prunes, rec.Pruned)
	}
	klog.FromContext(ctx).Info("Rollout step", "rule", c.rule, "step", rec.Step, "steps", rec.Steps, "triggers", len(batch), "moved", rec.Moved, "total", rec.Total)
	c.out.Record(ctx, rec, "Normal", "RolloutStep", msg)
	for _, t := range batch {
		c.host.Requeue(t.Key)
	}
}

// nextClusters begins the next step of a rollout by cluster: at the
// first, every trigger moves to the new revision — unless what that
// removes passes maxPrunes, when the rollout halts — and each step brings
// it to more clusters (StepClusters), the triggers all reconciled again
// and judged anew; after the last, the rollout is complete.
func (c *Coordinator) nextClusters(ctx context.Context, s rules.Rollout) {
	rec := c.Record()
	steps := len(s.Clusters) + 1
	if rec.Step >= steps {
		c.complete(ctx)
		return
	}
	prunes := 0
	if rec.Step == 0 {
		// Every trigger's: a rollout superseded mid-way had moved them
		// all, and what it removes is this one's to count too.
		c.mu.Lock()
		all := slices.Collect(maps.Keys(c.stepKeys(0, math.MaxUint64)))
		c.mu.Unlock()
		prunes = c.host.Prunes(ctx, all)
		if budget := s.MaxPrunes.Of(rec.Children); prunes > 0 && rec.Pruned+prunes > budget {
			c.halt(ctx, ReasonPruneBudget, fmt.Sprintf(
				"the change removes %d of the rule's %d children, more than maxPrunes %s allows (%d): to confirm, raise spec.rollout.maxPrunes (100%% allows any removal)",
				prunes, rec.Children, s.MaxPrunes, budget))
			return
		}
	}
	c.mu.Lock()
	c.rec.StepFrom, c.rec.Threshold = 0, math.MaxUint64
	c.rec.Step++
	c.rec.Steps = steps
	c.rec.Moved = c.rec.Total
	c.rec.Pruned += prunes
	c.rec.StepStarted = time.Now()
	c.step = c.stepKeys(0, math.MaxUint64)
	for key := range c.step {
		delete(c.health, key)
	}
	rec = c.rec
	step := maps.Clone(c.step)
	c.mu.Unlock()
	where := "no cluster"
	if clusters := c.host.StepClusters(s, rec.Step-1); len(clusters) > 0 {
		where = "cluster " + strings.Join(clusters, ", ")
	}
	msg := fmt.Sprintf("step %d of %d: revision %s reaches %s (%d triggers)", rec.Step, rec.Steps, Short(rec.To), where, len(step))
	if prunes > 0 {
		msg += fmt.Sprintf("; it removes %d children", prunes)
	}
	klog.FromContext(ctx).Info("Rollout step", "rule", c.rule, "step", rec.Step, "steps", rec.Steps, "reaches", where, "triggers", len(step))
	c.out.Record(ctx, rec, "Normal", "RolloutStep", msg)
	for key := range step {
		c.host.Requeue(key)
	}
}

// check moves on when the step under way is healthy, or fails it when its
// deadline has passed with more failed triggers than maxFailures allows.
func (c *Coordinator) check(ctx context.Context) {
	s := *c.settings.Load()
	unhealthy, overdue, failed, ok := c.stepHealth(ctx, s)
	if !ok {
		return
	}
	switch {
	case unhealthy == 0:
	case !overdue:
		return
	case unhealthy > s.MaxFailures:
		c.fail(ctx, s, failed)
		return
	}
	c.next(ctx)
}

// stepHealth is the health of the step under way: how many of its
// triggers are not healthy, whether its deadline has passed, and when
// both fail it, why each failed; ok is false when no step is under way.
func (c *Coordinator) stepHealth(ctx context.Context, s rules.Rollout) (unhealthy int, overdue bool, failed []string, ok bool) {
	if c.sharded {
		c.judgeFromCaches(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec.State != Progressing || c.rec.Step == 0 {
		return 0, false, nil, false
	}
	triggers := c.host.Triggers()
	for key := range c.step {
		if h := c.health[key]; !h.OK {
			if _, exists, _ := triggers.GetByKey(key.String()); !exists {
				delete(c.step, key) // deleted: simply gone
				continue
			}
			unhealthy++
		}
	}
	overdue = time.Since(c.rec.StepStarted) > s.ProgressDeadline
	if unhealthy > s.MaxFailures && overdue {
		for key := range c.step {
			if h, seen := c.health[key]; !seen {
				failed = append(failed, key.String()+": not reconciled under the new revision yet")
			} else if !h.OK {
				failed = append(failed, key.String()+": "+h.Why)
			}
		}
	}
	return unhealthy, overdue, failed, true
}

// judgeFromCaches judges the triggers of the step under way from the
// caches: in a sharded group other replicas reconcile most of a step,
// and the caches hold every trigger's children. Host.Health renders, and
// a render reads the record (the clusters a rollout by cluster holds
// back): it is called without c.mu — under it, the coordinating replica
// of a sharded rollout by cluster deadlocked at its first check, every
// reconcile and /readyz with it. A judgement is kept only if the step
// has not moved meanwhile.
func (c *Coordinator) judgeFromCaches(ctx context.Context) {
	c.mu.Lock()
	step, keys := c.rec.Step, slices.Collect(maps.Keys(c.step))
	judging := c.rec.State == Progressing && step > 0
	c.mu.Unlock()
	if !judging {
		return
	}
	judged := make(map[cache.ObjectName]Health, len(keys))
	for _, key := range keys {
		judged[key] = c.host.Health(ctx, key)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rec.Step != step {
		return
	}
	for key, h := range judged {
		if c.step[key] {
			c.health[key] = h
		}
	}
}

// fail ends a step that failed: the rollout halts, or rolls back.
func (c *Coordinator) fail(ctx context.Context, s rules.Rollout, failed []string) {
	slices.Sort(failed)
	msg := fmt.Sprintf("step %d: %d triggers not healthy within %v (maxFailures %d): %s", c.Record().Step, len(failed), s.ProgressDeadline, s.MaxFailures, summarize(failed, 5))
	if s.OnFailure == rules.RolloutRollback {
		c.rollBack(ctx, msg)
		return
	}
	c.halt(ctx, ReasonStepFailed, msg)
}

func (c *Coordinator) halt(ctx context.Context, reason, msg string) {
	c.mu.Lock()
	c.rec.State, c.rec.Reason, c.rec.Message = Halted, reason, msg
	rec := c.rec
	c.mu.Unlock()
	klog.FromContext(ctx).Info("Rollout halted", "rule", c.rule, "reason", reason, "message", msg)
	c.out.Record(ctx, rec, "Warning", "RolloutHalted", msg)
}

// rollBack moves every trigger on the new revision back: each is
// reconciled by the previous revision again.
func (c *Coordinator) rollBack(ctx context.Context, msg string) {
	var back []cache.ObjectName
	rec := func() Record {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.eachTrigger(func(t Trigger) {
			if c.rec.Puts(t) {
				back = append(back, t.Key)
			}
		})
		c.rec.State, c.rec.Reason, c.rec.Message = RolledBack, ReasonStepFailed, msg
		return c.rec
	}()
	klog.FromContext(ctx).Info("Rollout rolled back", "rule", c.rule, "triggers", len(back), "message", msg)
	c.out.Record(ctx, rec, "Warning", "RolloutRolledBack", fmt.Sprintf("%s; %d triggers go back to revision %s", msg, len(back), Short(rec.From)))
	for _, k := range back {
		c.host.Requeue(k)
	}
}

func (c *Coordinator) complete(ctx context.Context) {
	c.mu.Lock()
	c.settle()
	c.rec.State, c.rec.Reason, c.rec.Message = Complete, "", ""
	c.rec.Threshold = math.MaxUint64
	c.rec.Moved = c.rec.Total
	c.step = map[cache.ObjectName]bool{}
	rec := c.rec
	c.mu.Unlock()
	klog.FromContext(ctx).Info("Rollout complete", "rule", c.rule, "steps", rec.Step, "triggers", rec.Total)
	c.out.Record(ctx, rec, "Normal", "RolloutComplete", fmt.Sprintf("every trigger is on revision %s, after %d steps", Short(rec.To), rec.Step))
}

// Short is a revision hash as revisions are named: its first 10 digits.
func Short(hash string) string { return hash[:min(10, len(hash))] }

// summarize lists the first n of items, and how many more there are.
func summarize(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:n], "; "), len(items)-n)
}
