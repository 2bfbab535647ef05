package manager

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	typedcoordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/rules"
)

// The labels and annotations of shard Leases.
const (
	// LabelShardGroup names the group a shard Lease belongs to.
	LabelShardGroup = rules.Group + "/shard-group"
	// AnnotationShardView is the view a member works under: the members'
	// names, sorted, comma-separated. A member without it (joining) works
	// on nothing.
	AnnotationShardView = rules.Group + "/shard-view"
)

// Sharding runs the engine on this replica's share of the triggers: the
// replicas of one group share them, each holding a Lease of its own in
// Namespace. The protocol is in docs/how-it-works.md ("Sharding").
type Sharding struct {
	Namespace string
	// Group names the group; the Leases are <Group>-shard-<member>.
	Group string
	// Identity names this member; "" is the host name (a pod's name).
	// Characters a Lease's name cannot have become '-'.
	Identity string

	member string // Identity as a name
	lease  string // the Lease's name
	holder string // holderIdentity: member and a UUID, one per process
	p      *process
	m      *metrics.Shard

	mu        sync.Mutex
	members   *view     // the group's Leases, as last seen
	published *view     // this member's view as the cache shows it
	pending   *view     // the view being written, until the cache shows it
	assigned  string    // the assignment last given to the engine
	lastSeen  time.Time // of this member's Lease in the cache
}

var notNameChars = regexp.MustCompile(`[^a-z0-9.-]+`)

// memberName makes identity a valid part of a Lease's name.
func memberName(identity string) string {
	n := strings.Trim(notNameChars.ReplaceAllString(strings.ToLower(identity), "-"), "-.")
	if n == "" {
		n = "member"
	}
	return n
}

func (s *Sharding) configure(p *process, o *engine.Options) error {
	if s.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("sharding: this replica needs an identity: %w", err)
		}
		s.Identity = host
	}
	s.member = memberName(s.Identity)
	s.lease = s.Group + "-shard-" + s.member
	if len(s.lease) > 253 {
		return fmt.Errorf("sharding: Lease name %q is longer than 253 characters", s.lease)
	}
	s.holder = s.member + "_" + string(uuid.NewUUID())
	s.p = p
	s.m = metrics.NewShard(p.reg, func() map[string]int { return p.engine.Owned() })
	o.Shard = newAssignment(s.member, nil, nil) // nothing until it has joined
	s.assigned = o.Shard.(*assignment).String()
	return nil
}

func (s *Sharding) status() modeStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.published == nil:
		return modeStatus{line: fmt.Sprintf("shard: joining group %s as %s (Lease %s/%s)", s.Group, s.member, s.Namespace, s.lease)}
	case !s.published.equal(s.members):
		return modeStatus{line: fmt.Sprintf("shard: member %s of group %s, handing over: members [%s], working under [%s]", s.member, s.Group, s.members, s.published)}
	}
	return modeStatus{line: fmt.Sprintf("shard: member %s of group %s, members [%s]", s.member, s.Group, s.published), ready: true}
}

func (s *Sharding) run(ctx context.Context, p *process) error {
	logger := klog.FromContext(ctx).WithValues("lease", s.Namespace+"/"+s.lease)
	engineCtx := ctx
	ctx = klog.NewContext(ctx, logger)
	client := p.clients.Core.CoordinationV1().Leases(s.Namespace)
	mine, err := s.join(ctx, client)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("sharding: %w", err)
	}
	logger.Info("Joined the shard group", "group", s.Group, "member", s.member)

	// The group's Leases, watched. The renewals and the coordinator run on
	// a context that outlives ctx until the engine has drained.
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	factory := informers.NewSharedInformerFactoryWithOptions(p.clients.Core, 0, informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{LabelShardGroup: s.Group}).String()
		}))
	inf := factory.Coordination().V1().Leases()
	changed := make(chan struct{}, 1)
	kick := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}); err != nil {
		return err
	}
	factory.Start(bg.Done())
	defer factory.Shutdown()

	r := &renewer{client: client, lease: mine, renewed: time.Now(), start: time.Now()}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.renew(bg, r)
	}()
	go func() {
		defer wg.Done()
		if !cache.WaitForCacheSync(bg.Done(), inf.Informer().HasSynced) {
			return
		}
		s.coordinate(bg, inf.Lister(), r, changed)
	}()

	p.runEngine(engineCtx) // returns drained
	stop()
	wg.Wait()
	// Leaving: everything drained, the Lease goes and the others take
	// this member's triggers at once.
	leaveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.delete(leaveCtx); err != nil && !apierrors.IsNotFound(err) {
		logger.Error(err, "Could not remove this member's Lease: the others take its triggers once it expires")
	} else {
		logger.Info("Left the shard group")
	}
	return nil
}

// join creates this member's Lease, with no view: it works on nothing
// until it has published one. A Lease of the same name held by another
// process (this pod's container before a restart, or a replica given the
// same identity) is waited out: it is removed once it has expired.
func (s *Sharding) join(ctx context.Context, client typedcoordinationv1.LeaseInterface) (*coordinationv1.Lease, error) {
	logger := klog.FromContext(ctx)
	var seenRV string
	var seenAt time.Time
	for {
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.lease, Namespace: s.Namespace, Labels: map[string]string{LabelShardGroup: s.Group}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       &s.holder,
				LeaseDurationSeconds: ptr.To(int32(LeaseDuration / time.Second)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		created, err := client.Create(ctx, l, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			logger.Error(err, "Cannot create this member's Lease: retrying")
		} else if old, err := client.Get(ctx, s.lease, metav1.GetOptions{}); err == nil {
			if old.ResourceVersion != seenRV {
				if seenRV == "" {
					logger.Info("This member's Lease is held by another process: waiting for it to expire (two replicas with one identity?)", "holder", ptr.Deref(old.Spec.HolderIdentity, ""))
				}
				seenRV, seenAt = old.ResourceVersion, time.Now()
			} else if time.Since(seenAt) > leaseDurationOf(old) {
				if err := deleteLease(ctx, client, old); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					logger.Error(err, "Cannot remove the expired Lease")
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(RetryPeriod):
		}
	}
}

// renewer writes this member's Lease: renewals, and the view.
type renewer struct {
	client typedcoordinationv1.LeaseInterface

	mu      sync.Mutex
	lease   *coordinationv1.Lease // as last written
	view    *view                 // to write
	renewed time.Time             // last successful write

	// start and fresh (since start, on the monotonic clock) are the last
	// successful write for current, without the lock.
	start time.Time
	fresh atomic.Int64
}

// current reports whether the Lease was renewed within RenewDeadline: a
// process that was paused longer (the others may have taken its Lease for
// expired meanwhile) starts no work until it has renewed, or exits.
func (r *renewer) current() bool {
	return time.Since(r.start)-time.Duration(r.fresh.Load()) < RenewDeadline
}

// write renews the Lease with the view to write.
func (r *renewer) write(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lease.DeepCopy()
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if r.view != nil {
		l.Annotations[AnnotationShardView] = r.view.String()
	}
	wctx, cancel := context.WithTimeout(ctx, RenewDeadline)
	defer cancel()
	out, err := r.client.Update(wctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		// An earlier write that went through but whose answer was lost?
		// Then the Lease is still this process's: write on its version.
		cur, gerr := r.client.Get(wctx, l.Name, metav1.GetOptions{})
		if gerr != nil || cur.UID != l.UID || ptr.Deref(cur.Spec.HolderIdentity, "") != ptr.Deref(l.Spec.HolderIdentity, "") {
			return err
		}
		l.ResourceVersion = cur.ResourceVersion
		out, err = r.client.Update(wctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		return err
	}
	r.lease, r.renewed = out, time.Now()
	r.fresh.Store(int64(time.Since(r.start)))
	return nil
}

// publish writes v as this member's view.
func (r *renewer) publish(ctx context.Context, v *view) error {
	r.mu.Lock()
	r.view = v
	r.mu.Unlock()
	return r.write(ctx)
}

// delete removes the Lease: this incarnation's (its UID), whatever its
// version — a renewal cut short at shutdown may have gone through.
func (r *renewer) delete(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.client.Delete(ctx, r.lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &r.lease.UID}})
}

// renew renews the Lease every RetryPeriod until ctx ends. A member that
// cannot renew for RenewDeadline, or whose Lease is gone (the others took
// it for expired), ends the process: the others take its triggers once the
// Lease expires, and it must not write by then.
func (s *Sharding) renew(ctx context.Context, r *renewer) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := r.write(ctx)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			exitNow(logger, "This member's Lease was removed or taken: exiting so that no write follows", "err", err)
		default:
			r.mu.Lock()
			since := time.Since(r.renewed)
			r.mu.Unlock()
			if since > RenewDeadline {
				exitNow(logger, "Could not renew this member's Lease: exiting so that no write follows", "err", err, "since", since)
			}
			logger.Error(err, "Renewing this member's Lease failed: retrying")
		}
	}
}

// coordinate follows the group's Leases until ctx ends: it removes the
// Leases of members that stopped renewing, hands over triggers when the
// members change, and keeps the engine's assignment in line with the views
// the members have published.
func (s *Sharding) coordinate(ctx context.Context, lister coordinationlisters.LeaseLister, r *renewer, changed <-chan struct{}) {
	t := time.NewTicker(RetryPeriod / 2)
	defer t.Stop()
	seen := map[string]observed{} // other members' Leases: last change seen
	for {
		s.step(ctx, lister, r, seen)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// observed is when a Lease was last seen to change, on this replica's
// clock (clocks of replicas need not agree, only run at the same rate).
type observed struct {
	rv string
	at time.Time
}

func (s *Sharding) step(ctx context.Context, lister coordinationlisters.LeaseLister, r *renewer, seen map[string]observed) {
	logger := klog.FromContext(ctx)
	leases, err := lister.List(labels.Everything())
	if err != nil {
		return
	}
	now := time.Now()
	var names []string
	others := map[string]*view{}
	var own *coordinationv1.Lease
	present := map[string]bool{}
	for _, l := range leases {
		name, ok := strings.CutPrefix(l.Name, s.Group+"-shard-")
		if !ok {
			continue
		}
		present[l.Name] = true
		names = append(names, name)
		if l.Name == s.lease {
			own = l
			continue
		}
		others[name] = parseView(l.Annotations[AnnotationShardView])
		o, ok := seen[l.Name]
		if !ok || o.rv != l.ResourceVersion {
			seen[l.Name] = observed{rv: l.ResourceVersion, at: now}
		} else if now.Sub(o.at) > leaseDurationOf(l) {
			// Expired: removed with the version seen as precondition, so
			// that a renewal since then keeps it. The members drop it when
			// they see it gone.
			logger.Info("A member's Lease expired: removing it, its triggers are taken over", "member", name, "holder", ptr.Deref(l.Spec.HolderIdentity, ""))
			if err := deleteLease(ctx, r.client, l); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				logger.Error(err, "Cannot remove an expired Lease")
			}
			delete(seen, l.Name)
		}
	}
	for name := range seen {
		if !present[name] {
			delete(seen, name)
		}
	}
	s.mu.Lock()
	lastSeen := s.lastSeen
	s.mu.Unlock()
	if own == nil {
		if !lastSeen.IsZero() {
			exitNow(logger, "This member's Lease was removed (the others took it for expired): exiting so that no write follows")
		}
		return // not in the cache yet
	}
	members := newView(names)
	published := parseView(own.Annotations[AnnotationShardView])
	s.mu.Lock()
	s.lastSeen = now
	s.members = members
	s.published = published
	pending := s.pending
	if pending != nil && pending.equal(published) {
		pending, s.pending = nil, nil
	}
	s.mu.Unlock()
	s.m.Members(published.size())

	if !members.equal(published) && !members.equal(pending) {
		// Hand over: stop the triggers lost under the new view and wait
		// for their reconciles, then publish it. The triggers gained wait
		// until the members that had them publish views without them.
		start := time.Now()
		mine := []*view{published, members}
		if pending != nil {
			mine = append(mine, pending)
		}
		s.assign(ctx, newAssignment(s.member, mine, others).while(r.current))
		if err := r.publish(ctx, members); err != nil {
			logger.Error(err, "Publishing this member's view failed: retrying")
			return
		}
		s.mu.Lock()
		s.pending = members
		pending = members
		s.mu.Unlock()
		s.m.HandedOver(time.Since(start))
		logger.Info("Shard members changed: handed over", "members", members.String(), "took", time.Since(start).Round(time.Millisecond))
	}
	mine := []*view{published}
	if pending != nil {
		mine = append(mine, pending)
	}
	s.assign(ctx, newAssignment(s.member, mine, others).while(r.current))
}

// assign gives a to the engine if it differs from the last one; SetShard
// returns once the reconciles of triggers a takes away have finished.
func (s *Sharding) assign(ctx context.Context, a *assignment) {
	key := a.String()
	s.mu.Lock()
	same := key == s.assigned
	s.mu.Unlock()
	if same {
		return
	}
	klog.FromContext(ctx).V(2).Info("Shard assignment", "assignment", key)
	s.p.engine.SetShard(ctx, a)
	s.mu.Lock()
	s.assigned = key
	s.mu.Unlock()
}

func deleteLease(ctx context.Context, client typedcoordinationv1.LeaseInterface, l *coordinationv1.Lease) error {
	return client.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
}

func leaseDurationOf(l *coordinationv1.Lease) time.Duration {
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return LeaseDuration
}
