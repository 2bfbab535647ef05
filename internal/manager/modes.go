package manager

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
)

// Single runs the engine all the time, on every trigger: one replica.
type Single struct{}

func (Single) configure(*process, *engine.Options) error { return nil }

func (Single) run(ctx context.Context, p *process) error {
	p.runEngine(ctx)
	return nil
}

func (Single) status() modeStatus { return modeStatus{ready: true} }

// Lease timings are client-go's usual ones, for leader election and
// sharding alike: a member that stops renewing is replaced within
// LeaseDuration; one that cannot renew for RenewDeadline stops working
// first; renewals and retries come every RetryPeriod.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
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

func (l *LeaderElection) configure(*process, *engine.Options) error {
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

func (l *LeaderElection) run(ctx context.Context, p *process) error {
	logger := klog.FromContext(ctx)
	lease := l.Namespace + "/" + l.Name
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name},
		Client:     p.clients.Core.CoordinationV1(),
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
				p.runEngine(workCtx)
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

// exitNow ends the process at once, status 1: this replica can no longer be
// sure that no other one writes what it would.
func exitNow(logger klog.Logger, msg string, kv ...any) {
	logger.Error(nil, msg, kv...)
	klog.Flush()
	os.Exit(1)
}
