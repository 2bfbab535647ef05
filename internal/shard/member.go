package shard

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
	"k8s.io/client-go/kubernetes"
	typedcoordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/rules"
)

// Lease timings are client-go's usual ones (its leader election's): a
// member that stops renewing is replaced within LeaseDuration; one that
// cannot renew for RenewDeadline stops working first; renewals and retries
// come every RetryPeriod.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// Config names one member of a shard group.
type Config struct {
	// Namespace holds the group's Leases.
	Namespace string
	// Group names the group; the Leases are <Group>-shard-<member>.
	Group string
	// Identity names this member; "" is the host name (a pod's name).
	// Characters a Lease's name cannot have become '-'.
	Identity string
	// Lost is called, once the member has logged why, when it can no
	// longer be sure that no other one writes what it would (its Lease
	// was taken, or not renewed in time): it must end the process at once
	// (the manager exits).
	Lost func()
}

// Target is what a member gives its triggers to: the engine.
type Target interface {
	// SetShard makes s the triggers worked on, and returns once the
	// reconciles of those s takes away have finished.
	SetShard(ctx context.Context, s engine.Shard)
}

// Member is one replica's membership of a shard group.
type Member struct {
	namespace, group string
	member           string // Identity as a name
	lease            string // the Lease's name
	holder           string // holderIdentity: member and a UUID, one per process
	lost             func()
	target           Target
	m                *metrics.Shard

	mu        sync.Mutex
	members   *view     // the group's Leases, as last seen
	published *view     // this member's view as the cache shows it
	pending   *view     // the view being written, until the cache shows it
	assigned  string    // the assignment last given to the target
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

// New makes the member c names; nothing runs until Run.
func New(c Config) (*Member, error) {
	if c.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("sharding: this replica needs an identity: %w", err)
		}
		c.Identity = host
	}
	s := &Member{namespace: c.Namespace, group: c.Group, member: memberName(c.Identity), lost: c.Lost}
	s.lease = s.group + "-shard-" + s.member
	if len(s.lease) > 253 {
		return nil, fmt.Errorf("sharding: Lease name %q is longer than 253 characters", s.lease)
	}
	s.holder = s.member + "_" + string(uuid.NewUUID())
	s.assigned = newAssignment(s.member, nil, nil).String()
	return s, nil
}

// Initial is the shard a member has before it has joined: no trigger.
func (s *Member) Initial() engine.Shard { return newAssignment(s.member, nil, nil) }

// lose logs why this member lost its Lease and calls Config.Lost.
func (s *Member) lose(logger klog.Logger, msg string, keysAndValues ...any) {
	logger.Error(nil, msg, keysAndValues...)
	s.lost()
}

// Status says where the member is, and whether it is ready: not while it
// joins or hands over.
func (s *Member) Status() (line string, ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.published == nil:
		return fmt.Sprintf("shard: joining group %s as %s (Lease %s/%s)", s.group, s.member, s.namespace, s.lease), false
	case !s.published.equal(s.members):
		return fmt.Sprintf("shard: member %s of group %s, handing over: members [%s], working under [%s]", s.member, s.group, s.members, s.published), false
	}
	return fmt.Sprintf("shard: member %s of group %s, members [%s]", s.member, s.group, s.published), true
}

// Run joins the group, runs work (the engine, which returns drained once
// ctx ends) while following the group's Leases and giving target this
// member's triggers, and leaves: the Lease goes, and the others take this
// member's triggers at once. m counts members and handovers.
func (s *Member) Run(ctx context.Context, core kubernetes.Interface, target Target, m *metrics.Shard, work func(context.Context)) error {
	s.target, s.m = target, m
	logger := klog.FromContext(ctx).WithValues("lease", s.namespace+"/"+s.lease)
	workCtx := ctx
	ctx = klog.NewContext(ctx, logger)
	client := core.CoordinationV1().Leases(s.namespace)
	mine, err := s.join(ctx, client)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("sharding: %w", err)
	}
	logger.Info("Joined the shard group", "group", s.group, "member", s.member)

	// The renewals and the coordinator run on a context that outlives ctx
	// until the work has drained.
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	group, err := s.watchGroup(bg, core)
	if err != nil {
		return err
	}
	defer group.factory.Shutdown()
	r := &renewer{client: client, lease: mine, renewed: time.Now(), start: time.Now()}
	var wg sync.WaitGroup
	wg.Go(func() { s.renew(bg, r) })
	wg.Go(func() {
		if cache.WaitFor(bg, "", group.synced) {
			s.coordinate(bg, group.lister, r, group.changed)
		}
	})

	work(workCtx) // returns drained
	stop()
	wg.Wait()
	leaveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := r.delete(leaveCtx); err != nil && !apierrors.IsNotFound(err) {
		logger.Error(err, "Could not remove this member's Lease: the others take its triggers once it expires")
	} else {
		logger.Info("Left the shard group")
	}
	return nil
}

// groupWatch is the informer of the group's Leases.
type groupWatch struct {
	factory informers.SharedInformerFactory
	lister  coordinationlisters.LeaseLister
	synced  cache.DoneChecker // done once the Leases have listed
	changed chan struct{}     // has an element whenever a Lease changed
}

// watchGroup starts the informer of the group's Leases, until ctx ends.
func (s *Member) watchGroup(ctx context.Context, core kubernetes.Interface) (*groupWatch, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(core, 0, informers.WithNamespace(s.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.SelectorFromSet(labels.Set{rules.LabelShardGroup: s.group}).String()
		}))
	inf := factory.Coordination().V1().Leases()
	g := &groupWatch{factory: factory, lister: inf.Lister(), synced: inf.Informer().HasSyncedChecker(), changed: make(chan struct{}, 1)}
	kick := func() {
		select {
		case g.changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	return g, nil
}

// join creates this member's Lease, with no view: it works on nothing
// until it has published one. A Lease of the same name held by another
// process (this pod's container before a restart, or a replica given the
// same identity) is waited out: it is removed once it has expired.
func (s *Member) join(ctx context.Context, client typedcoordinationv1.LeaseInterface) (*coordinationv1.Lease, error) {
	logger := klog.FromContext(ctx)
	var seenRV string
	var seenAt time.Time
	for {
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: s.lease, Namespace: s.namespace, Labels: map[string]string{rules.LabelShardGroup: s.group}},
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
		l.Annotations[rules.AnnotationShardView] = r.view.String()
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
func (s *Member) renew(ctx context.Context, r *renewer) {
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
			s.lose(logger, "This member's Lease was removed or taken: exiting so that no write follows", "err", err)
		default:
			r.mu.Lock()
			since := time.Since(r.renewed)
			r.mu.Unlock()
			if since > RenewDeadline {
				s.lose(logger, "Could not renew this member's Lease: exiting so that no write follows", "err", err, "since", since)
			}
			logger.Error(err, "Renewing this member's Lease failed: retrying")
		}
	}
}

// coordinate follows the group's Leases until ctx ends: it removes the
// Leases of members that stopped renewing, hands over triggers when the
// members change, and keeps the engine's assignment in line with the views
// the members have published.
func (s *Member) coordinate(ctx context.Context, lister coordinationlisters.LeaseLister, r *renewer, changed <-chan struct{}) {
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

// step is one look at the group's Leases: expired ones are removed, and
// when the members differ from the view this member published, it hands
// over and publishes them; the target gets the assignment of the views.
func (s *Member) step(ctx context.Context, lister coordinationlisters.LeaseLister, r *renewer, seen map[string]observed) {
	logger := klog.FromContext(ctx)
	leases, err := lister.List(labels.Everything())
	if err != nil {
		return
	}
	names, others, own := s.observe(ctx, leases, r, seen)
	s.mu.Lock()
	lastSeen := s.lastSeen
	s.mu.Unlock()
	if own == nil {
		if !lastSeen.IsZero() {
			s.lose(logger, "This member's Lease was removed (the others took it for expired): exiting so that no write follows")
		}
		return // not in the cache yet
	}
	members := newView(names)
	published := parseView(own.Annotations[rules.AnnotationShardView])
	s.mu.Lock()
	s.lastSeen = time.Now()
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

// observe reads the group's Leases: the members' names, the views the
// others published, and this member's Lease (nil while the cache lacks
// it). A Lease that has not changed for its duration, on this replica's
// clock, has expired: it is removed, with the version seen as
// precondition, so that a renewal since then keeps it; the members drop it
// when they see it gone.
func (s *Member) observe(ctx context.Context, leases []*coordinationv1.Lease, r *renewer, seen map[string]observed) ([]string, map[string]*view, *coordinationv1.Lease) {
	logger := klog.FromContext(ctx)
	now := time.Now()
	var names []string
	others := map[string]*view{}
	var own *coordinationv1.Lease
	present := map[string]bool{}
	for _, l := range leases {
		name, ok := strings.CutPrefix(l.Name, s.group+"-shard-")
		if !ok {
			continue
		}
		present[l.Name] = true
		names = append(names, name)
		if l.Name == s.lease {
			own = l
			continue
		}
		others[name] = parseView(l.Annotations[rules.AnnotationShardView])
		o, ok := seen[l.Name]
		if !ok || o.rv != l.ResourceVersion {
			seen[l.Name] = observed{rv: l.ResourceVersion, at: now}
		} else if now.Sub(o.at) > leaseDurationOf(l) {
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
	return names, others, own
}

// assign gives a to the target if it differs from the last one; SetShard
// returns once the reconciles of triggers a takes away have finished.
func (s *Member) assign(ctx context.Context, a *assignment) {
	key := a.String()
	s.mu.Lock()
	same := key == s.assigned
	s.mu.Unlock()
	if same {
		return
	}
	klog.FromContext(ctx).V(2).Info("Shard assignment", "assignment", key)
	s.target.SetShard(ctx, a)
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
