package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/rules"
)

// KubeconfigKey is the key of a kubeconfig Secret that holds the
// kubeconfig, as Cluster API writes it.
const KubeconfigKey = "value"

// ReasonBadKubeconfig is the reason of the Warning Event on a kubeconfig
// Secret whose kubeconfig does not make a client.
const ReasonBadKubeconfig = "BadKubeconfig"

// Metrics receives what the inventory counts; nil counts nothing.
type Metrics interface {
	// KubeconfigInvalid counts one kubeconfig Secret of cluster that did
	// not make a client.
	KubeconfigInvalid(cluster string)
}

// Options configure an Inventory.
type Options struct {
	// Recorder emits the Warning Events on kubeconfig Secrets; nil: none.
	Recorder record.EventRecorder
	Metrics  Metrics
	// Configure, when set, adjusts the rest.Config of each cluster's
	// client before it is made (rate limits, flow control).
	Configure func(*rest.Config)
	// ProbeInterval is how often a cluster found not answering is asked
	// again (GET /readyz) until it answers; 0: 2 seconds.
	ProbeInterval time.Duration
	// Trust is what a kubeconfig may do beyond inline credentials: by
	// default nothing (kubeconfig.go).
	Trust Trust
	// Bounds bound every request to a cluster: deadlines and sizes.
	Bounds dynamic.Bounds
}

// Inventory is syncloop's fleet: the kubeconfig Secrets in one namespace
// that carry Cluster API's cluster-name label, each a cluster named by
// the label, labelled with the Secret's labels, and reached with a client
// made from its kubeconfig (key value). Secrets added, changed and
// removed take effect at once (watched); a kubeconfig that makes no
// client is a Warning Event on its Secret and a metric, and the cluster is
// left out. It never logs, records or returns a kubeconfig's contents.
type Inventory struct {
	core      kubernetes.Interface
	namespace string
	opts      Options

	mu       sync.RWMutex
	clusters map[string]*cluster // by name
	// refused are the Secrets left out as another's cluster (its API
	// server), by name: put again when the clusters change (readmit).
	refused map[string]*corev1.Secret
	// leftOut are the Secrets left out of the inventory and why, by name.
	leftOut map[string]refusal
	subs    map[int]func()
	nextSub int
	ctx     context.Context // Run's: the probes' parent
	synced  cache.InformerSynced
	// wanted is closed by the first Subscribe: Run starts watching.
	wanted chan struct{}
	want   sync.Once
}

// cluster is one cluster of the inventory and how it is reached.
type cluster struct {
	rules.Cluster // written and read under the Inventory's mu
	// source is the Secret as it was read; server its API server
	// (serverOf), one cluster's in the inventory.
	source *corev1.Secret
	server string
	remote dynamic.Remote
	disc   discovery.DiscoveryInterface
	health *health
}

// New returns the inventory of the kubeconfig Secrets in namespace; it
// is empty until Run.
func New(core kubernetes.Interface, namespace string, o Options) *Inventory {
	if o.ProbeInterval == 0 {
		o.ProbeInterval = 2 * time.Second
	}
	return &Inventory{core: core, namespace: namespace, opts: o, clusters: map[string]*cluster{}, refused: map[string]*corev1.Secret{}, leftOut: map[string]refusal{}, subs: map[int]func(){},
		ctx: context.Background(), synced: func() bool { return false }, wanted: make(chan struct{})}
}

// Namespace is where the inventory's Secrets are.
func (inv *Inventory) Namespace() string { return inv.namespace }

// Run watches the kubeconfig Secrets until ctx ends — from the first
// Subscribe on: a syncloop whose rules target no cluster never lists a
// Secret.
func (inv *Inventory) Run(ctx context.Context) {
	select {
	case <-inv.wanted:
	case <-ctx.Done():
		return
	}
	inv.watch(ctx)
}

func (inv *Inventory) watch(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(inv.core, 0, informers.WithNamespace(inv.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = rules.LabelClusterName }))
	inf := factory.Core().V1().Secrets().Informer()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { inv.put(ctx, obj) },
		UpdateFunc: func(_, obj any) { inv.put(ctx, obj) },
		DeleteFunc: func(obj any) { inv.remove(ctx, obj) },
	})
	if err != nil { // the informer has not started: never
		klog.FromContext(ctx).Error(err, "Cannot watch the kubeconfig Secrets")
		return
	}
	inv.mu.Lock()
	// Synced once every Secret listed has been put: which of two Secrets
	// of one API server keeps it is settled before anything reconciles.
	inv.ctx, inv.synced = ctx, reg.HasSynced
	inv.mu.Unlock()
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// Load lists the kubeconfig Secrets once, without watching them: the
// inventory of a one-shot command (trace). A Secret that makes no client
// is left out, as Run leaves it out.
func (inv *Inventory) Load(ctx context.Context) error {
	list, err := inv.core.CoreV1().Secrets(inv.namespace).List(ctx, metav1.ListOptions{LabelSelector: rules.LabelClusterName})
	if err != nil {
		return fmt.Errorf("the kubeconfig Secrets in namespace %s: %w", inv.namespace, err)
	}
	for i := range list.Items {
		inv.put(ctx, &list.Items[i])
	}
	inv.mu.Lock()
	inv.synced = func() bool { return true }
	inv.mu.Unlock()
	return nil
}

// WaitForSync waits until the Secrets have been listed once, or ctx ends.
func (inv *Inventory) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), func() bool {
		inv.mu.RLock()
		defer inv.mu.RUnlock()
		return inv.synced()
	})
}

// Clusters are the clusters of the inventory, by name.
func (inv *Inventory) Clusters() []rules.Cluster {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	out := make([]rules.Cluster, 0, len(inv.clusters))
	for _, c := range inv.clusters {
		out = append(out, c.Cluster)
	}
	slices.SortFunc(out, func(a, b rules.Cluster) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Reach is how to reach the cluster named name; false when the inventory
// has no such cluster.
func (inv *Inventory) Reach(name string) (dynamic.Remote, bool) {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	c, ok := inv.clusters[name]
	if !ok {
		return dynamic.Remote{}, false
	}
	return c.remote, true
}

// refusal is a Secret left out of the inventory: the cluster it names,
// and why.
type refusal struct {
	cluster, secret string
	err             error
}

// LeftOut says why the cluster named name is not in the inventory though
// a Secret names it — its kubeconfig was refused or made no client,
// another Secret has its API server — or nil if no Secret naming it was
// left out. It holds nothing of what a kubeconfig holds.
func (inv *Inventory) LeftOut(name string) error {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	var secrets []string
	var errs []error
	for _, r := range inv.leftOut {
		if r.cluster == name {
			secrets = append(secrets, r.secret)
			errs = append(errs, r.err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	if len(errs) > 1 {
		slices.Sort(secrets)
		return fmt.Errorf("its kubeconfig Secrets %s were left out", strings.Join(secrets, ", "))
	}
	return fmt.Errorf("its kubeconfig Secret %s was left out: %w", secrets[0], errs[0])
}

// Unreachable are the clusters that do not answer now, by name.
func (inv *Inventory) Unreachable() []string {
	var out []string
	for _, st := range inv.Statuses() {
		if st.Down != nil {
			out = append(out, st.Name)
		}
	}
	return out
}

// Status is one cluster of the inventory as /readyz and the metrics show
// it: whether it answers.
type Status struct {
	Name string
	// Down says why it does not answer; nil: it does, as far as is known.
	Down error
}

// Statuses are the clusters of the inventory and whether they answer, by
// name.
func (inv *Inventory) Statuses() []Status {
	inv.mu.RLock()
	out := make([]Status, 0, len(inv.clusters))
	for name, c := range inv.clusters {
		out = append(out, Status{Name: name, Down: c.health.isDown()})
	}
	inv.mu.RUnlock()
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Subscribe has f called whenever the inventory changes — a cluster
// added, relabelled, given a new kubeconfig or removed — or a cluster
// stops or starts answering. f must not block. cancel stops the calls.
func (inv *Inventory) Subscribe(f func()) (cancel func()) {
	inv.want.Do(func() { close(inv.wanted) })
	inv.mu.Lock()
	defer inv.mu.Unlock()
	id := inv.nextSub
	inv.nextSub++
	inv.subs[id] = f
	return func() {
		inv.mu.Lock()
		delete(inv.subs, id)
		inv.mu.Unlock()
	}
}

func (inv *Inventory) changed() {
	inv.mu.RLock()
	subs := make([]func(), 0, len(inv.subs))
	for _, f := range inv.subs {
		subs = append(subs, f)
	}
	inv.mu.RUnlock()
	for _, f := range subs {
		f()
	}
}

// put takes in an added or changed Secret.
func (inv *Inventory) put(ctx context.Context, obj any) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	cl, ok := rules.ClusterOf(s)
	if !ok {
		inv.mu.Lock()
		delete(inv.leftOut, s.Name)
		inv.mu.Unlock()
		inv.forgetSecret(s.Name)
		return
	}
	logger := klog.FromContext(ctx).WithValues("cluster", cl.Name, "secret", klog.KObj(s))
	version := versionOf(s.Data[KubeconfigKey])
	inv.mu.RLock()
	old := inv.clusters[cl.Name]
	inv.mu.RUnlock()
	if old != nil && old.source.Name != s.Name {
		inv.invalid(ctx, s, cl.Name, fmt.Errorf("cluster %q is already the cluster of Secret %s: one Secret per cluster", cl.Name, old.source.Name))
		return
	}
	if old != nil && old.remote.Version == version {
		if !equalLabels(old.Labels, cl.Labels) {
			inv.mu.Lock()
			old.Cluster = cl // read under inv.mu
			inv.mu.Unlock()
			logger.Info("Cluster relabelled", "labels", cl.Labels)
			inv.changed()
		}
		return
	}
	c, err := inv.connect(cl, s, version)
	if err != nil {
		inv.invalid(ctx, s, cl.Name, err)
		if old != nil { // its old kubeconfig no longer stands
			inv.forget(cl.Name)
			inv.readmit(ctx)
		}
		return
	}
	if holder := inv.alias(c); holder != nil {
		if !c.olderThan(holder) {
			inv.refuse(ctx, c, holder)
			if old != nil {
				inv.forget(cl.Name)
			}
			return
		}
		inv.forget(holder.Name)
		inv.refuse(ctx, holder, c)
	}
	inv.forgetSecret(s.Name) // the Secret named another cluster before
	inv.mu.Lock()
	inv.clusters[cl.Name] = c
	delete(inv.refused, s.Name)
	delete(inv.leftOut, s.Name)
	inv.mu.Unlock()
	logger.Info("Cluster in the inventory", "labels", cl.Labels, "server", c.hostOf())
	inv.changed()
	if old != nil { // its old server may be another Secret's
		inv.readmit(ctx)
	}
}

func (c *cluster) hostOf() string {
	if c.remote.Client == nil {
		return ""
	}
	return c.remote.Client.Host()
}

// remove forgets the cluster of a deleted Secret.
func (inv *Inventory) remove(ctx context.Context, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return
	}
	inv.mu.Lock()
	delete(inv.refused, s.Name)
	delete(inv.leftOut, s.Name)
	inv.mu.Unlock()
	if name := inv.forgetSecret(s.Name); name != "" {
		klog.FromContext(ctx).Info("Cluster left the inventory: its children there stay as they are", "cluster", name, "secret", klog.KObj(s))
		inv.readmit(ctx)
	}
}

// forgetSecret forgets the cluster of the Secret named secret, and
// returns its name ("" if none).
func (inv *Inventory) forgetSecret(secret string) string {
	inv.mu.RLock()
	name := ""
	for n, c := range inv.clusters {
		if c.source.Name == secret {
			name = n
		}
	}
	inv.mu.RUnlock()
	if name != "" {
		inv.forget(name)
	}
	return name
}

func (inv *Inventory) forget(name string) {
	inv.mu.Lock()
	delete(inv.clusters, name)
	inv.mu.Unlock()
	inv.changed()
}

// invalid reports a kubeconfig Secret that makes no client: a Warning
// Event on it and the metric. err never holds the kubeconfig's contents.
func (inv *Inventory) invalid(ctx context.Context, s *corev1.Secret, name string, err error) {
	inv.mu.Lock()
	inv.leftOut[s.Name] = refusal{cluster: name, secret: s.Namespace + "/" + s.Name, err: err}
	inv.mu.Unlock()
	klog.FromContext(ctx).Error(err, "Kubeconfig Secret left out of the inventory", "cluster", name, "secret", klog.KObj(s))
	if inv.opts.Recorder != nil {
		inv.opts.Recorder.Eventf(s, corev1.EventTypeWarning, ReasonBadKubeconfig, "cluster %q left out of syncloop's inventory: %v", name, err)
	}
	if inv.opts.Metrics != nil {
		inv.opts.Metrics.KubeconfigInvalid(name)
	}
}

// connect makes the client of cl, the cluster of Secret s, from its
// kubeconfig (version: versionOf's).
func (inv *Inventory) connect(cl rules.Cluster, s *corev1.Secret, version string) (*cluster, error) {
	kubeconfig := s.Data[KubeconfigKey]
	if len(kubeconfig) == 0 {
		return nil, fmt.Errorf("the Secret has no key %q holding a kubeconfig", KubeconfigKey)
	}
	cfg, err := restConfig(kubeconfig, inv.opts.Trust)
	if err != nil {
		return nil, err
	}
	if inv.opts.Configure != nil {
		inv.opts.Configure(cfg)
	}
	dynamic.Bound(cfg, inv.opts.Bounds)
	client, err := dynamic.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("making a client from key %q: %w", KubeconfigKey, err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("making a client from key %q: %w", KubeconfigKey, err)
	}
	c := &cluster{Cluster: cl, source: s, server: serverOf(cfg.Host), disc: disc, health: &health{}}
	c.remote = dynamic.Remote{Version: version, Client: client, Mapper: dynamic.NewMapper(disc, 0),
		Down: c.health.isDown, Returns: c.health.returned, Failed: func(err error) { inv.failed(cl.Name, err) }}
	return c, nil
}

func versionOf(kubeconfig []byte) string {
	sum := sha256.Sum256(kubeconfig)
	return hex.EncodeToString(sum[:8])
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// failed marks cluster name down, if it is not already, and probes it
// until it answers — after setting it aside a while, if it keeps failing
// (health.fail).
func (inv *Inventory) failed(name string, err error) {
	inv.mu.RLock()
	c, ok := inv.clusters[name]
	ctx := inv.ctx
	inv.mu.RUnlock()
	if !ok {
		return
	}
	start, aside := c.health.fail(err, time.Now(), inv.opts.ProbeInterval)
	if !start {
		return
	}
	klog.FromContext(ctx).Info("Cluster not answering: its children wait there, as they are, until it does", "cluster", name, "err", err, "setAside", aside)
	inv.changed()
	go inv.probe(ctx, c, aside)
}

// probe waits out aside, then asks c's API server whether it is ready
// until it answers, and marks it reachable again.
func (inv *Inventory) probe(ctx context.Context, c *cluster, aside time.Duration) {
	defer inv.contain(ctx, c.Name)
	first := time.NewTimer(max(aside, inv.opts.ProbeInterval))
	defer first.Stop()
	select {
	case <-ctx.Done():
		return
	case <-first.C:
	}
	t := time.NewTicker(inv.opts.ProbeInterval)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, inv.opts.ProbeInterval)
		err := c.disc.RESTClient().Get().AbsPath("/readyz").Do(pctx).Error()
		cancel()
		if c.health.probed(err, time.Now()) {
			klog.FromContext(ctx).Info("Cluster answering again", "cluster", c.Name)
			inv.changed()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
