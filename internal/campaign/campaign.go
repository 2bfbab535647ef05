package campaign

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
	"github.com/syncloop/syncloop/rules"
)

// Config says what one campaign runs.
type Config struct {
	// Seed decides every random choice: the workload, the faults, when
	// processes die. The same seed replays the same campaign (up to the
	// timing of the processes).
	Seed uint64
	// Topology is Single, Leader or Sharded.
	Topology string
	// Duration is how long faults are injected; then the campaign waits
	// for convergence and judges.
	Duration time.Duration
	// Binary is the syncloop to run.
	Binary string
	// Faults are the proxy's; zero: DefaultFaults.
	Faults Faults
	// ProcessFaultEvery is the mean time between process faults (a
	// replica SIGKILLed and restarted, kube-apiserver restarted); zero:
	// 10 s.
	ProcessFaultEvery time.Duration
	// Converge bounds how long syncloop may take, once the faults stop,
	// to bring every child to what the model says.
	Converge time.Duration
	// Log receives the campaign's progress; nil: none.
	Log io.Writer
	// Keep, when set, is a directory the control plane's and replicas'
	// logs and the audit log are kept in; empty: removed.
	Keep string
}

// Report is what a campaign did and found.
type Report struct {
	Seed     uint64
	Topology string
	// Injected counts the faults by kind: the proxy's, and process kills,
	// API server restarts and etcd compactions.
	Injected map[string]int
	// Ops counts the workload's changes by kind.
	Ops string
	// Checked lists the invariants judged, each with what it found.
	Checked []string
	// Violations are the invariants broken; none: the campaign passed.
	Violations []string
	// Converged is how long syncloop took to converge after the faults.
	Converged time.Duration
	// Writes is the audit log's count of syncloop's writes.
	Writes int
	// SteppedDown counts replicas that exited on purpose, their Lease
	// not renewed in time (restarted, as a Deployment would).
	SteppedDown int
}

// Faults is the number of faults injected.
func (r *Report) Faults() int {
	n := 0
	for k, v := range r.Injected {
		if !strings.HasSuffix(k, "/write") {
			n += v
		}
	}
	return n
}

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "campaign seed %d, topology %s\n", r.Seed, r.Topology)
	fmt.Fprintf(&b, "  injected %d faults: %s\n", r.Faults(), describe(r.Injected))
	fmt.Fprintf(&b, "  workload: %s\n", r.Ops)
	fmt.Fprintf(&b, "  converged %v after the faults stopped; %d writes by syncloop in the audit log; %d replicas stepped down (Lease not renewed) and were restarted\n", r.Converged.Round(100*time.Millisecond), r.Writes, r.SteppedDown)
	for _, c := range r.Checked {
		fmt.Fprintf(&b, "  checked: %s\n", c)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "  VIOLATION: %s\n", v)
	}
	if len(r.Violations) == 0 {
		b.WriteString("  every invariant held\n")
	} else {
		fmt.Fprintf(&b, "  replay: -seed %d -topology %s\n", r.Seed, r.Topology)
	}
	return b.String()
}

// compactionInterval is kube-apiserver's etcd compaction interval during
// a campaign: watches resuming from before a compaction get 410 Gone.
const compactionInterval = 15 * time.Second

// Run runs one campaign on a control plane of its own and judges it.
// An error is the campaign's failure to run, not a violation.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	dir := cfg.Keep
	if dir == "" {
		d, err := os.MkdirTemp("", "syncloop-campaign-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	s, err := setUp(ctx, cfg, dir)
	if err != nil {
		return nil, err
	}
	defer s.tearDown()
	report := &Report{Seed: cfg.Seed, Topology: cfg.Topology, Injected: map[string]int{}}
	cfg.logf("campaign seed %d, %s, %d replicas, faults for %v", cfg.Seed, cfg.Topology, len(s.rs.names), cfg.Duration)

	f := &faulting{cfg: cfg, env: s.env, rs: s.rs, proxy: s.proxy, report: report,
		rng: rand.New(rand.NewPCG(cfg.Seed^0xc2b2ae3d27d4eb4f, cfg.Seed+1))}
	if err := f.run(ctx, s.world); err != nil {
		return nil, err
	}
	report.Injected["etcd-compaction"] = int(cfg.Duration / compactionInterval)
	for k, v := range s.proxy.injected() {
		report.Injected[k] += v
	}
	report.Ops = s.world.opsDone()

	cfg.logf("faults stopped; waiting for convergence")
	start := time.Now()
	diff, err := converge(ctx, s.cs, s.world.dc, s.world, cfg.Converge, f.supervise)
	if err != nil {
		return nil, err
	}
	report.Converged = time.Since(start)
	report.Checked = append(report.Checked, fmt.Sprintf("convergence of children and statuses to the offline render of the final objects and rules within %v: %s", cfg.Converge, orNone(diff)))
	if len(diff) > 0 {
		report.Violations = append(report.Violations, fmt.Sprintf("not converged after %v: %s", cfg.Converge, strings.Join(diff, "; ")))
		for _, l := range s.rs.evidence(diff) {
			cfg.logf("%s", l)
		}
	}
	s.rs.stop()

	writes, err := readAudit(s.auditLog)
	if err != nil {
		return nil, err
	}
	report.Writes = len(writes)
	judge(report, writes, s.world, s.proxy.injected())
	return report, nil
}

func (cfg Config) withDefaults() Config {
	if cfg.Faults == (Faults{}) {
		cfg.Faults = DefaultFaults
	}
	if cfg.ProcessFaultEvery == 0 {
		cfg.ProcessFaultEvery = 10 * time.Second
	}
	if cfg.Converge == 0 {
		cfg.Converge = 2 * time.Minute
	}
	return cfg
}

// logf writes a line of progress to cfg.Log, if set.
func (cfg Config) logf(format string, args ...any) {
	if cfg.Log != nil {
		fmt.Fprintf(cfg.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// stage is what a campaign runs on: a control plane with an audit log,
// the fault proxy in front of it, the workload and syncloop's replicas,
// each started.
type stage struct {
	env      *testenv.Env
	proxy    *proxy
	cs       kubernetes.Interface
	world    *world
	rs       *replicas
	auditLog string
}

func setUp(ctx context.Context, cfg Config, dir string) (_ *stage, err error) {
	for _, sub := range []string{"rules", "replicas", "controlplane"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, err
		}
	}
	s := &stage{}
	defer func() {
		if err != nil {
			s.tearDown()
		}
	}()
	args, auditLog, err := auditArgs(dir)
	if err != nil {
		return nil, err
	}
	s.auditLog = auditLog
	args = append(args, fmt.Sprintf("--etcd-compaction-interval=%v", compactionInterval))
	if s.env, err = testenv.Start(ctx, testenv.Options{ControllerManager: true, Dir: filepath.Join(dir, "controlplane"), APIServerArgs: args}); err != nil {
		return nil, err
	}
	if s.proxy, err = startProxy(s.env.Config().Host, s.env.Dir(), s.env.Config().CAData, cfg.Seed, cfg.Faults); err != nil {
		return nil, err
	}
	if s.cs, err = kubernetes.NewForConfig(s.env.Config()); err != nil {
		return nil, err
	}
	dc, err := dynamic.NewForConfig(s.env.Config())
	if err != nil {
		return nil, err
	}
	s.world = newWorld(s.cs, dc, cfg.Seed, filepath.Join(dir, "rules"))
	if err := s.world.setUp(ctx); err != nil {
		return nil, err
	}
	if s.rs, err = newReplicas(ctx, s.env, s.proxy, cfg.Binary, filepath.Join(dir, "rules"), filepath.Join(dir, "replicas"), cfg.Topology); err != nil {
		return nil, err
	}
	for _, name := range s.rs.names {
		if err := s.rs.start(ctx, name); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// tearDown stops what setUp started, last first.
func (s *stage) tearDown() {
	if s.rs != nil {
		s.rs.stop()
	}
	if s.proxy != nil {
		s.proxy.close()
	}
	if s.env != nil {
		s.env.Stop()
	}
}

// judge checks the audit log's writes against the history.
func judge(report *Report, writes []write, w *world, injected map[string]int) {
	check := func(name string, bad []string) {
		report.Checked = append(report.Checked, fmt.Sprintf("%s: %d violations", name, len(bad)))
		report.Violations = append(report.Violations, bad...)
	}
	check("no write to an object syncloop does not own (triggers, the lookup source, foreign objects)", checkOwnership(writes, w))
	check("no two incarnations writing one trigger's children in turns", checkOneWriter(writes))
	check("no child deleted while wanted throughout the minute before", checkNoDesiredDeleted(writes, w))
	faultsOnWrites := 0
	for _, k := range []string{"reset-before", "reset-after", "server-error", "too-many-requests"} {
		faultsOnWrites += injected[k+"/write"]
	}
	summary, bad := checkWritesBounded(writes, w, faultsOnWrites)
	check("writes bounded: "+summary, bad)
}

func orNone(diff []string) string {
	if len(diff) == 0 {
		return "converged"
	}
	return fmt.Sprintf("%d differences", len(diff))
}

// owedGrace bounds how long the faults stay on past a campaign's end for
// the kinds owed (oweMissing) to be met.
const owedGrace = 30 * time.Second

// faulting runs the workload and injects the faults.
type faulting struct {
	cfg    Config
	env    *testenv.Env
	rs     *replicas
	proxy  *proxy
	report *Report
	rng    *rand.Rand
}

func (f *faulting) run(ctx context.Context, w *world) error {
	f.proxy.on.Store(true)
	defer f.proxy.on.Store(false)
	end := time.Now().Add(f.cfg.Duration)
	half := time.Now().Add(f.cfg.Duration / 2)
	nextFault := time.Now().Add(f.interval())
	// The faults owed at half time are met before they stop, however
	// long a process fault took of the campaign's second half (an API
	// server restart once left no request to meet them), up to a bound.
	for now := time.Now(); now.Before(end) || !half.IsZero() || f.proxy.owing() && now.Before(end.Add(owedGrace)); now = time.Now() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.step(ctx); err != nil {
			f.report.Injected["workload-step-failed"]++ // the API server was down: tried again
		}
		if err := f.supervise(ctx); err != nil {
			return err
		}
		if !half.IsZero() && time.Now().After(half) { // every kind of fault, at least once
			f.proxy.oweMissing()
			half = time.Time{}
		}
		if time.Now().After(nextFault) && time.Now().Before(end) {
			if err := f.processFault(ctx, half.IsZero()); err != nil {
				return err
			}
			nextFault = time.Now().Add(f.interval())
		}
		time.Sleep(time.Duration(20+f.rng.IntN(180)) * time.Millisecond)
	}
	// Every replica up again, the API server too.
	if err := f.env.Healthy(); err != nil {
		if err := f.env.StartAPIServer(ctx); err != nil {
			return err
		}
	}
	for _, name := range f.rs.down() {
		if err := f.rs.start(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// supervise restarts the replicas that exited, as a Deployment would,
// counting those that stepped down (their Lease not renewed in time) and
// reporting any other exit as a crash. It is called through the whole
// campaign, convergence included: a replica may step down after the
// last fault, when an API server restart outlasts its Lease.
func (f *faulting) supervise(ctx context.Context) error {
	steppedDown, crashed := f.rs.exitedEarly()
	for _, name := range crashed {
		f.report.Violations = append(f.report.Violations, "syncloop exited on its own: "+name+" (see its log)")
	}
	f.report.SteppedDown += len(steppedDown)
	for _, name := range append(steppedDown, crashed...) {
		if err := f.rs.start(ctx, strings.Fields(name)[0]); err != nil {
			return err
		}
	}
	return nil
}

// interval draws the time to the next process fault: uniform around the
// configured mean.
func (f *faulting) interval() time.Duration {
	mean := f.cfg.ProcessFaultEvery
	return mean/2 + time.Duration(f.rng.Int64N(int64(mean)))
}

// processFault kills and restarts a replica, or restarts kube-apiserver,
// or (a chance in five) does neither — but for the campaign's second half
// (late) if it has done neither yet.
func (f *faulting) processFault(ctx context.Context, late bool) error {
	n := f.rng.IntN(10)
	if late && f.report.Injected["sigkill"]+f.report.Injected["apiserver-restart"] == 0 {
		n = f.rng.IntN(8)
	}
	switch {
	case n < 6:
		up := f.rs.up()
		if len(up) == 0 {
			return nil
		}
		name := up[f.rng.IntN(len(up))]
		f.cfg.logf("SIGKILL %s", name)
		f.rs.kill(name)
		f.report.Injected["sigkill"]++
		time.Sleep(time.Duration(f.rng.IntN(3000)) * time.Millisecond)
		return f.rs.start(ctx, name)
	case n < 8:
		down := time.Duration(1000+f.rng.IntN(5000)) * time.Millisecond
		f.cfg.logf("kube-apiserver restart (%v down)", down)
		f.env.StopAPIServer()
		f.report.Injected["apiserver-restart"]++
		time.Sleep(down)
		return f.env.StartAPIServer(ctx)
	}
	return nil
}

// converge waits, up to bound, until the children in the cluster and the
// triggers' statuses are exactly what the offline render of the final
// objects and rules wants, and returns what differs if they never are;
// supervise keeps the replicas running meanwhile.
func converge(ctx context.Context, cs kubernetes.Interface, dc dynamic.Interface, w *world, bound time.Duration, supervise func(context.Context) error) ([]string, error) {
	var diff []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, bound, true, func(ctx context.Context) (bool, error) {
		if err := supervise(ctx); err != nil {
			return false, err
		}
		list, err := cs.CoreV1().ConfigMaps(workNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		talliesNow, err := dc.Resource(tallies).Namespace(workNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		var objects []*corev1.ConfigMap
		children := map[string]*corev1.ConfigMap{}
		for i := range list.Items {
			cm := &list.Items[i]
			if cm.Labels[rules.LabelManagedBy] == rules.ManagedByValue {
				children[cm.Name] = cm
				continue
			}
			objects = append(objects, cm)
		}
		all := asObjects(objects)
		for i := range talliesNow.Items {
			all = append(all, &talliesNow.Items[i])
		}
		want, err := w.modelWithStatus(ctx, all)
		if err != nil {
			return false, err
		}
		diff = append(diffChildren(want.children, children), diffStatuses(want.statuses, talliesNow.Items)...)
		return len(diff) == 0, nil
	})
	if err != nil && !wait.Interrupted(err) {
		return nil, err
	}
	return diff, nil
}

// diffStatuses says how the triggers' statuses differ from what is
// wanted: each field the rule's status sets, and the Ready condition.
func diffStatuses(want map[string]map[string]any, triggers []unstructured.Unstructured) []string {
	var out []string
	for _, t := range triggers {
		key := t.GetNamespace() + "/" + t.GetName()
		st, _ := t.Object["status"].(map[string]any)
		for k, v := range want[key] {
			if fmt.Sprint(st[k]) != fmt.Sprint(v) {
				out = append(out, fmt.Sprintf("%s: status.%s is %v, want %v", key, k, st[k], v))
			}
		}
		if !readyTrue(st) {
			out = append(out, key+": not Ready")
		}
	}
	return out
}

func readyTrue(status map[string]any) bool {
	conds, _ := status["conditions"].([]any)
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Ready" {
			return m["status"] == "True"
		}
	}
	return false
}

// diffChildren says how the children differ from what is wanted.
func diffChildren(want map[string]desiredChild, have map[string]*corev1.ConfigMap) []string {
	var out []string
	for name, c := range want {
		cm, ok := have[name]
		switch {
		case !ok:
			out = append(out, name+" missing")
		case cm.Labels[rules.LabelOwnerUID] != c.ownerUID:
			out = append(out, fmt.Sprintf("%s: owned by trigger UID %s, want %s", name, cm.Labels[rules.LabelOwnerUID], c.ownerUID))
		default:
			for k, v := range c.data {
				if cm.Data[k] != v {
					out = append(out, fmt.Sprintf("%s: data.%s is %q, want %q", name, k, cm.Data[k], v))
				}
			}
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			out = append(out, name+" left over (an orphan)")
		}
	}
	sort.Strings(out)
	return out
}
