package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// leaderFlags configure leader election.
type leaderFlags struct {
	enabled   bool
	namespace string
	id        string
	identity  string
}

// leaderTimings are client-go's usual ones: a crashed leader is replaced
// within 15s, a leader that stops cleanly at once (it releases the Lease).
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// leader tracks whether this process leads, for /readyz.
type leader struct {
	mu      sync.Mutex
	leading bool
	done    chan struct{} // closed when the engine run under the lease returned
}

func (l *leader) isLeading() bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// runAsLeader runs work only while this process holds the Lease
// namespace/id. On ctx's end it waits for work to finish — in-flight
// reconciles drain — and only then releases the Lease, so that the next
// leader never overlaps with this one's writes. Losing the Lease otherwise
// ends the process at once: work must stop before anyone else starts.
func runAsLeader(ctx context.Context, cs kubernetes.Interface, f leaderFlags, l *leader, work func(context.Context)) error {
	logger := klog.FromContext(ctx)
	identity := f.identity
	if identity == "" {
		host, _ := os.Hostname()
		identity = host + "_" + string(uuid.NewUUID())
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: f.namespace, Name: f.id},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	// The election's context outlives ctx until work has drained.
	electionCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	var shuttingDown sync.Once
	shutdown := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: true,
		Name:            f.id,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leaseCtx context.Context) {
				logger.Info("Leading: reconciling", "lease", f.namespace+"/"+f.id, "identity", identity)
				l.mu.Lock()
				l.leading = true
				l.mu.Unlock()
				workCtx, cancel := context.WithCancel(leaseCtx)
				defer cancel()
				stop := context.AfterFunc(ctx, cancel)
				defer stop()
				work(workCtx)
				close(l.done)
			},
			OnStoppedLeading: func() {
				select {
				case <-shutdown:
					return
				default:
				}
				logger.Error(nil, "Lost the leader Lease: exiting so that no write follows", "lease", f.namespace+"/"+f.id)
				klog.Flush()
				os.Exit(1)
			},
			OnNewLeader: func(current string) {
				if current != identity {
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
	shuttingDown.Do(func() { close(shutdown) })
	stopElection() // releases the Lease
	<-electionDone
	return nil
}
