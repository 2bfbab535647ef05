package campaign

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// Topologies the campaign runs syncloop in.
const (
	Single  = "single"  // one replica
	Leader  = "leader"  // two replicas, leader-elected
	Sharded = "sharded" // three replicas sharing the triggers
)

// replicas are syncloop's processes: each start of a replica is an
// incarnation of its own, acting as a ServiceAccount of its own (the
// audit log tells them apart), its requests going through the proxy.
type replicas struct {
	env      *testenv.Env
	proxy    *proxy
	bin      string
	rulesDir string
	logDir   string
	topology string
	names    []string
	running  map[string]*replica
	starts   int
}

type replica struct {
	incarnation string
	cmd         *exec.Cmd
	exited      chan struct{}
}

func newReplicas(ctx context.Context, env *testenv.Env, p *proxy, bin, rulesDir, logDir, topology string) (*replicas, error) {
	n := map[string]int{Single: 1, Leader: 2, Sharded: 3}[topology]
	if n == 0 {
		return nil, fmt.Errorf("unknown topology %q: %s, %s or %s", topology, Single, Leader, Sharded)
	}
	cs, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return nil, err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: identities}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "campaign-syncloop"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:" + identities}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	rs := &replicas{env: env, proxy: p, bin: bin, rulesDir: rulesDir, logDir: logDir, topology: topology, running: map[string]*replica{}}
	for i := range n {
		rs.names = append(rs.names, fmt.Sprintf("r%d", i))
	}
	return rs, nil
}

// start starts replica name as a new incarnation.
func (rs *replicas) start(ctx context.Context, name string) error {
	rs.starts++
	incarnation := fmt.Sprintf("%s-%d", name, rs.starts)
	cfg, err := rs.env.ServiceAccountConfig(ctx, identities, incarnation)
	if err != nil {
		return err
	}
	cfg.Host = rs.proxy.URL()
	kubeconfig := filepath.Join(rs.logDir, incarnation+".kubeconfig")
	if err := testenv.WriteKubeconfig(kubeconfig, cfg, incarnation); err != nil {
		return err
	}
	args := []string{"run", "-f", rs.rulesDir, "--kubeconfig", kubeconfig, "--metrics-bind-address", "0", "--health-probe-bind-address", "0", "-v=2",
		"--leader-elect-namespace", identities, "--leader-elect-id", "campaign", "--leader-elect-identity", incarnation}
	switch rs.topology {
	case Leader:
		args = append(args, "--leader-elect")
	case Sharded:
		args = append(args, "--sharding")
	}
	log, err := os.Create(filepath.Join(rs.logDir, incarnation+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(rs.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	r := &replica{incarnation: incarnation, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(r.exited) }()
	rs.running[name] = r
	return nil
}

// kill SIGKILLs replica name, as a crashed node would.
func (rs *replicas) kill(name string) {
	if r := rs.running[name]; r != nil {
		_ = r.cmd.Process.Kill()
		<-r.exited
		delete(rs.running, name)
	}
}

// down are the replicas not running.
func (rs *replicas) down() []string {
	var out []string
	for _, name := range rs.names {
		if rs.running[name] == nil {
			out = append(out, name)
		}
	}
	return out
}

// up are the replicas running.
func (rs *replicas) up() []string {
	var out []string
	for name := range rs.running {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// exitedEarly lists, by name, the replicas that ended without being
// asked to, and whether each stepped down: a replica that cannot renew
// its Lease exits on purpose, so that no write follows (a Deployment
// starts it again); any other exit is a crash.
func (rs *replicas) exitedEarly() (steppedDown, crashed []string) {
	for _, name := range rs.up() {
		r := rs.running[name]
		select {
		case <-r.exited:
		default:
			continue
		}
		delete(rs.running, name)
		log, _ := os.ReadFile(filepath.Join(rs.logDir, r.incarnation+".log"))
		if strings.Contains(string(log), "exiting so that no write follows") {
			steppedDown = append(steppedDown, name)
		} else {
			crashed = append(crashed, name+" ("+r.incarnation+")")
		}
	}
	return steppedDown, crashed
}

// stop stops every replica with SIGTERM, as a rollout of the Deployment
// would.
func (rs *replicas) stop() {
	for name, r := range rs.running {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(45 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
		delete(rs.running, name)
	}
}

// evidence is, for a campaign that did not converge, what the replicas'
// logs say of what differs (diff): of each incarnation, the last lines
// that name one of the objects, or tell of the shard group, Leases or
// watches ended — which replica held the object, and whether it saw it.
func (rs *replicas) evidence(diff []string) []string {
	names := map[string]bool{}
	for _, d := range diff {
		for _, m := range diffNames.FindAllStringSubmatch(d, -1) {
			names[m[1]+m[2]] = true
		}
	}
	logs, _ := filepath.Glob(filepath.Join(rs.logDir, "*.log"))
	var out []string
	for _, path := range logs {
		data, _ := os.ReadFile(path)
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			keep := strings.Contains(l, "hard") || strings.Contains(l, "Lease") || strings.Contains(l, "Watch ended")
			for n := range names {
				keep = keep || strings.Contains(l, n)
			}
			if keep {
				lines = append(lines, l)
			}
		}
		if len(lines) > evidenceLines {
			lines = lines[len(lines)-evidenceLines:]
		}
		for _, l := range lines {
			out = append(out, filepath.Base(path)+": "+l)
		}
	}
	return out
}

// evidenceLines bounds the lines evidence takes of one log.
const evidenceLines = 25

// diffNames finds the objects a convergence difference names: a
// trigger's "campaign/y1:" or a child's "tally-y1-a".
var diffNames = regexp.MustCompile(`(?:campaign/)([a-z0-9]+)|(?:^|; |\b)([a-z]+-[a-z0-9]+-[a-z0-9]+)\b`)
