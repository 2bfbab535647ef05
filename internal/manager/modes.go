package manager

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/internal/shard"
)

// A Mode runs the engine the way one replica of an installation does.
// Single, LeaderElection and Sharding are the modes.
type Mode interface {
	// configure adjusts the engine's options before the engine is made.
	configure(o *engine.Options) error
	// run runs the engine (r.engine) as the mode allows until ctx ends,
	// and returns once it has stopped.
	run(ctx context.Context, r *runner) error
	// status is the mode's part of /readyz.
	status() modeStatus
}

// runner is what a mode is given to run: the engine on the rules in
// force, and what a mode needs besides.
type runner struct {
	// engine runs the rules in force, and each new set, until ctx ends;
	// it returns drained.
	engine func(ctx context.Context)
	// shards is the engine's side of sharding: the shard it works on,
	// and how many triggers of each rule it owns.
	shards interface {
		shard.Target
		Owned() map[string]int
		Cached() map[string]int
	}
	core kubernetes.Interface
	reg  prometheus.Registerer
}

// modeStatus is what a mode says in /readyz.
type modeStatus struct {
	line    string // shown first; "" none
	standby bool   // the engine does not run here: ready without it
	ready   bool   // false: not ready, whatever the engine says
}

// Single runs the engine all the time, on every trigger: one replica.
type Single struct{}

func (Single) configure(*engine.Options) error { return nil }

func (Single) run(ctx context.Context, r *runner) error {
	r.engine(ctx)
	return nil
}

func (Single) status() modeStatus { return modeStatus{ready: true} }

// Lease timings, for leader election and sharding alike: client-go's
// usual ones (shard.LeaseDuration and the others).
const (
	LeaseDuration = shard.LeaseDuration
	RenewDeadline = shard.RenewDeadline
	RetryPeriod   = shard.RetryPeriod
)

// defaultIdentity is hostname_uuid: unique to this process.
func defaultIdentity() string {
	host, _ := os.Hostname()
	return host + "_" + string(uuid.NewUUID())
}

// LeaderElection runs the engine only while this replica holds the Lease
// Namespace/Name, so that other replicas stand by.
//
// On shutdown it waits for the engine to drain — in-flight reconciles
// finish — and only then releases the Lease, so that the next leader never
// overlaps with this one's writes. Losing the Lease otherwise ends the
// process at once: work must stop before anyone else starts.
type LeaderElection struct {
	Namespace, Name string
	// Identity is this replica's in the Lease; "" is hostname_uuid.
	Identity string

	mu      sync.Mutex
	leading bool
	done    chan struct{} // closed when the engine run under the Lease returned
}

func (l *LeaderElection) configure(*engine.Options) error {
	if l.Identity == "" {
		l.Identity = defaultIdentity()
	}
	l.done = make(chan struct{})
	return nil
}

func (l *LeaderElection) status() modeStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.leading {
		// A standby is ready: it takes over as soon as the Lease is free.
		return modeStatus{line: "standby: another replica holds the leader Lease", standby: true, ready: true}
	}
	return modeStatus{line: fmt.Sprintf("leader: holding Lease %s/%s as %s", l.Namespace, l.Name, l.Identity), ready: true}
}

func (l *LeaderElection) run(ctx context.Context, r *runner) error {
	logger := klog.FromContext(ctx)
	lease := l.Namespace + "/" + l.Name
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name},
		Client:     r.core.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: l.Identity},
	}
	// The election's context outlives ctx until the engine has drained.
	electionCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	shutdown := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   LeaseDuration,
		RenewDeadline:   RenewDeadline,
		RetryPeriod:     RetryPeriod,
		ReleaseOnCancel: true,
		Name:            l.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leaseCtx context.Context) {
				logger.Info("Leading: reconciling", "lease", lease, "identity", l.Identity)
				l.mu.Lock()
				l.leading = true
				l.mu.Unlock()
				workCtx, cancel := context.WithCancel(leaseCtx)
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				r.engine(workCtx)
				close(l.done)
			},
			OnStoppedLeading: func() {
				select {
				case <-shutdown:
					return
				default:
				}
				exitNow(logger, "Lost the leader Lease: exiting so that no write follows", "lease", lease)
			},
			OnNewLeader: func(current string) {
				if current != l.Identity {
					logger.Info("Standing by", "leader", current)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	electionDone := make(chan struct{})
	go func() {
		defer close(electionDone)
		elector.Run(electionCtx)
	}()
	<-ctx.Done()
	l.mu.Lock()
	leading := l.leading
	l.mu.Unlock()
	if leading {
		<-l.done // drained
	}
	close(shutdown)
	stopElection() // releases the Lease
	<-electionDone
	return nil
}

// Sharding runs the engine on this replica's share of the triggers: the
// replicas of one group share them, each holding a Lease of its own in
// Namespace. The protocol is package shard's.
type Sharding struct {
	Namespace string
	// Group names the group; the Leases are <Group>-shard-<member>.
	Group string
	// Identity names this member; "" is the host name (a pod's name).
	Identity string

	member *shard.Member
}

func (s *Sharding) configure(o *engine.Options) error {
	m, err := shard.New(shard.Config{Namespace: s.Namespace, Group: s.Group, Identity: s.Identity,
		Lost: exit})
	if err != nil {
		return err
	}
	s.member = m
	o.Shard = m.Initial() // nothing until it has joined
	return nil
}

func (s *Sharding) run(ctx context.Context, r *runner) error {
	return s.member.Run(ctx, r.core, r.shards, metrics.NewShard(r.reg, r.shards.Owned, r.shards.Cached), r.engine)
}

func (s *Sharding) status() modeStatus {
	line, ready := s.member.Status()
	return modeStatus{line: line, ready: ready}
}

// exitNow ends the process at once, status 1: this replica can no longer be
// sure that no other one writes what it would.
func exitNow(logger klog.Logger, msg string, kv ...any) {
	logger.Error(nil, msg, kv...)
	exit()
}

func exit() {
	klog.Flush()
	os.Exit(1)
}
