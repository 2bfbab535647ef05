// Package rollout is the coordinator of a changed rule's rollout: it
// moves the triggers there when the rollout began from the revision
// rolled out from to the new one in steps, in the order of their salted
// digests, each step once the one before is healthy, and keeps the
// record from which every replica tells which revision a trigger is on.
//
// It knows the rule's loop only through Host (the cached triggers, a step's
// health and prunes, requeueing) and writes only through Recorder (the
// store, or in a dry run the plan): it is tested without informers.
package rollout

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
)

// Host is the rule's loop as its rollout sees it.
type Host interface {
	// Triggers are the rule's cached triggers; nil before the loop has
	// subscribed.
	Triggers() cache.Store
	// Requeue queues a trigger whose revision changed.
	Requeue(key cache.ObjectName)
	// Coordinates reports whether this replica steps the rollout: not
	// sharded, or its shard owns the rule's coordination key.
	Coordinates() bool
	// Children counts the rule's children in the caches.
	Children() int
	// Prunes counts the children moving keys to the new revision would
	// remove, rendered against the caches.
	Prunes(ctx context.Context, keys []cache.ObjectName) int
	// Health judges trigger key under the new revision from the caches
	// alone (sharded: other replicas reconcile most of a step). It is
	// called without the coordinator's lock: it may read the record.
	Health(ctx context.Context, key cache.ObjectName) Health
	// Contained reports v, a panic recovered in the coordinator, and
	// returns it as an error; it is called from the deferred function
	// that recovered it.
	Contained(ctx context.Context, v any) error
	// Settled is told once every trigger is on the new revision for good.
	Settled()
	// StepClusters are the clusters step i (from 0) of a rollout by
	// cluster under s brings the new revision to, by name.
	StepClusters(s rules.Rollout, i int) []string
}

// Recorder is where the coordinator's record goes: the store, or in a
// dry run the plan. It is the one place a rollout tells them apart.
type Recorder interface {
	// Record keeps rec and says the transition (reason, eventType Normal
	// or Warning).
	Record(ctx context.Context, rec Record, eventType, reason, message string)
	// Fetch reads the record the coordinating replica keeps (nil: none).
	Fetch(ctx context.Context) (*Record, error)
}

// Coordinator is one rollout of a rule.
type Coordinator struct {
	rule string
	host Host
	out  Recorder
	// sharded: replicas share the triggers. The replica whose shard owns
	// the rule's coordination key steps the rollout, judging the health
	// of every trigger of a step from its caches; the others follow the
	// record it keeps.
	sharded bool
	// settled: complete, every trigger is on the new revision for good.
	settled  atomic.Bool
	settings atomic.Pointer[rules.Rollout]
	poke     chan struct{}

	mu  sync.Mutex
	rec Record
	// step are the triggers of the step under way; health what the last
	// reconcile under the new revision made of each trigger on it.
	step   map[cache.ObjectName]bool
	health map[cache.ObjectName]Health
}

// New makes the rollout of rule (the revision rolled out to, and its
// settings) as p says.
func New(rule *rules.Rule, p Plan, sharded bool, h Host, out Recorder) *Coordinator {
	c := &Coordinator{rule: rule.Name, host: h, out: out, sharded: sharded, rec: p.Rec, poke: make(chan struct{}, 1),
		step: map[cache.ObjectName]bool{}, health: map[cache.ObjectName]Health{}}
	c.rec.From, c.rec.To = p.From.Hash, rule.Hash
	s := rule.Rollout
	c.settings.Store(&s)
	c.settled.Store(c.rec.State == Complete)
	return c
}

// Record is the rollout as it stands.
func (c *Coordinator) Record() Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec
}

// Settled reports whether every trigger is on the new revision for good.
func (c *Coordinator) Settled() bool { return c.settled.Load() }

// Starting reports whether the rollout has yet to take its first step
// (or to decide it cannot).
func (c *Coordinator) Starting() bool {
	rec := c.Record()
	return rec.State == "" || rec.State == Progressing && rec.Step == 0
}

// OnNew reports whether trigger key is on the new revision.
func (c *Coordinator) OnNew(key cache.ObjectName) bool {
	t := Trigger{Key: key, Digest: Digest(c.rule, key)}
	if s := c.host.Triggers(); s != nil {
		if obj, ok, _ := s.GetByKey(key.String()); ok {
			t.Created = obj.(metav1.Object).GetCreationTimestamp().Time
		}
	}
	rec := c.Record()
	return rec.Puts(t)
}

// Observe notes what a reconcile under the new revision made of trigger
// key, and wakes the rollout when it is one it waits for.
func (c *Coordinator) Observe(key cache.ObjectName, h Health) {
	c.mu.Lock()
	if !c.rec.active() && c.rec.State != "" {
		c.mu.Unlock()
		return
	}
	c.health[key] = h
	waited := c.step[key]
	c.mu.Unlock()
	if waited {
		c.wake()
	}
}

func (c *Coordinator) wake() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// settle marks the rollout complete for good.
func (c *Coordinator) settle() {
	if !c.settled.Swap(true) {
		c.host.Settled()
	}
}

// Status is the rollout as it stands, with the cached triggers counted on
// each revision.
func (c *Coordinator) Status() Status {
	st := Status{Rule: c.rule, Record: c.Record()}
	if s := c.Settings(); s.ByCluster() {
		st.ByCluster = true
		for i := range min(st.Step, len(s.Clusters)+1) {
			st.Reached = append(st.Reached, c.host.StepClusters(s, i)...)
		}
	}
	c.eachTrigger(func(t Trigger) {
		if st.Puts(t) {
			st.OnTo++
		} else {
			st.OnFrom++
		}
	})
	if st.State == Progressing && st.Step > 0 && c.host.Coordinates() {
		c.mu.Lock()
		st.Judging = len(c.step)
		for key := range c.step {
			if c.health[key].OK {
				st.Healthy++
			}
		}
		c.mu.Unlock()
	}
	return st
}

// eachTrigger calls fn with every cached trigger.
func (c *Coordinator) eachTrigger(fn func(Trigger)) {
	s := c.host.Triggers()
	if s == nil {
		return
	}
	for _, obj := range s.List() {
		u := obj.(metav1.Object)
		key := cache.ObjectName{Namespace: u.GetNamespace(), Name: u.GetName()}
		fn(Trigger{Key: key, Digest: Digest(c.rule, key), Created: u.GetCreationTimestamp().Time})
	}
}

// Settings are the rollout settings it goes on under.
func (c *Coordinator) Settings() rules.Rollout { return *c.settings.Load() }

// SetSettings takes the rule's rollout settings as they now are; a halted
// rollout goes on under them (raising maxPrunes confirms a removal).
func (c *Coordinator) SetSettings(ctx context.Context, s rules.Rollout) {
	if old := c.settings.Load(); old != nil && old.Equal(s) {
		return
	}
	c.settings.Store(&s)
	if !c.host.Coordinates() {
		return // the coordinating replica resumes it, and this one follows
	}
	c.mu.Lock()
	halted := c.rec.State == Halted
	if halted { // the step under way is checked again, under them
		c.rec.State, c.rec.Reason, c.rec.Message = Progressing, "", ""
		c.rec.StepStarted = time.Now()
	}
	rec := c.rec
	c.mu.Unlock()
	if halted {
		c.out.Record(ctx, rec, "Normal", "RolloutResumed", fmt.Sprintf("the rollout settings changed (%s): going on from step %d", s, rec.Step))
		c.wake()
	}
}

// Run drives the rollout, once the loop's informers have synced, until
// ctx ends: it checks the step under way when a trigger it waits for was
// reconciled, and every second for the deadline.
func (c *Coordinator) Run(ctx context.Context) {
	if c.sharded {
		c.runSharded(ctx)
		return
	}
	c.guard(ctx, c.begin)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.poke:
		case <-tick.C:
		}
		c.guard(ctx, c.check)
	}
}

// guard runs fn, a step of the coordinator, and contains a panic in it:
// the rollout halts where it is — the triggers moved stay on the new
// revision, the others on the old — and says why.
func (c *Coordinator) guard(ctx context.Context, fn func(context.Context)) {
	defer func() {
		if v := recover(); v != nil {
			err := c.host.Contained(ctx, v)
			c.contain(ctx, func(ctx context.Context) { c.halt(ctx, ReasonPanic, err.Error()) })
		}
	}()
	fn(ctx)
}

// contain runs fn and contains a panic in it, which it only reports.
func (c *Coordinator) contain(ctx context.Context, fn func(context.Context)) {
	defer func() {
		if v := recover(); v != nil {
			_ = c.host.Contained(ctx, v)
		}
	}()
	fn(ctx)
}

// begin starts the rollout, or picks it up where its record says.
func (c *Coordinator) begin(ctx context.Context) {
	func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.rec.State == "" {
			c.rec.State = Progressing
			c.rec.Total, c.rec.Moved = c.counts()
			c.rec.Children = c.host.Children()
		} else {
			c.step = c.stepKeys(c.rec.StepFrom, c.rec.Threshold)
		}
	}()
	if rec := c.Record(); rec.State == Progressing && rec.Step == 0 {
		c.next(ctx)
	}
}

// runSharded drives the rollout of a sharded group: every second the
// replica that coordinates checks the step under way (and begins the
// rollout, unless another replica has already: it reads the record
// first); every other replica reads the record and follows it, queueing
// its own triggers that changed revision. It stops following once the
// rollout is complete or rolled back.
func (c *Coordinator) runSharded(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	began, ticks := false, 0
	for {
		state := c.Record().State
		switch {
		case c.host.Coordinates():
			if !began {
				c.guard(ctx, c.follow)
				c.guard(ctx, c.begin)
				began = true
			}
			c.guard(ctx, c.check)
		case c.settled.Load() || state == RolledBack:
		case state == Halted && ticks%10 != 0: // halted for long, perhaps: read it less often
		default:
			began = false
			c.guard(ctx, c.follow)
		}
		// Once a second, not on every reconcile (poke): the coordinator
		// renders the whole step to judge it, a follower reads the record.
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			ticks++
		}
	}
}

// follow takes the record the coordinating replica keeps, when it is of
// this rollout, and queues this replica's triggers that it moves.
func (c *Coordinator) follow(ctx context.Context) {
	rec, err := c.out.Fetch(ctx)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Reading the rule's rollout", "rule", c.rule, "err", err)
		return
	}
	c.mu.Lock()
	if rec == nil || rec.To != c.rec.To || rec.From != c.rec.From || rec.State == "" || rec.State == Superseded {
		c.mu.Unlock()
		return
	}
	old := c.rec
	c.rec = *rec
	c.step = c.stepKeys(rec.StepFrom, rec.Threshold)
	c.mu.Unlock()
	if rec.State == Complete {
		c.settle()
	}
	if old.State == rec.State && old.Threshold == rec.Threshold && old.Started.Equal(rec.Started) && old.Step == rec.Step {
		return
	}
	// By cluster, every step brings the triggers to more clusters.
	byCluster := c.settings.Load().ByCluster() && old.Step != rec.Step
	c.eachTrigger(func(t Trigger) {
		if old.Puts(t) != rec.Puts(t) || byCluster {
			c.host.Requeue(t.Key)
		}
	})
}

// Supersede records that the rule changed again, to the revision hashed
// by, before the rollout ended.
func (c *Coordinator) Supersede(ctx context.Context, by string) {
	if !c.host.Coordinates() {
		return
	}
	c.mu.Lock()
	if !c.rec.active() {
		c.mu.Unlock()
		return
	}
	c.rec.State, c.rec.Reason, c.rec.Message = Superseded, "", "the rule changed again: revision "+Short(by)+" took its triggers over"
	rec := c.rec
	c.mu.Unlock()
	c.out.Record(ctx, rec, "Normal", "RolloutSuperseded", rec.Message)
}
