package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options says what to start.
type Options struct {
	// ControllerManager also starts kube-controller-manager with the garbage
	// collector, the namespace controller and the service account token
	// controller, for tests of ownerReferences, namespace deletion and
	// token Secrets. It costs about a second and 100 MB.
	ControllerManager bool
	// Controllers, when set, are the controllers kube-controller-manager
	// runs instead of those three.
	Controllers []string
	// Dir is the scratch directory (etcd data, PKI, logs, kubeconfig). Empty:
	// a new temporary directory, removed by Stop.
	Dir string
	// Workloads also starts kube-controller-manager's deployment and
	// replicaset controllers (with those ControllerManager starts),
	// kube-scheduler, and kwok playing the kubelet of one fake Node
	// (FakeNode): a Deployment's Pods are scheduled and become Running
	// and Ready, so its availableReplicas means something. It implies
	// ControllerManager and costs about a second and 100 MB more.
	Workloads bool
	// APIServerArgs are extra kube-apiserver flags ("--name=value"), e.g. a
	// short --etcd-compaction-interval for watch-expiry tests.
	APIServerArgs []string
}

// Env is a running control plane. Its methods are safe for concurrent use.
type Env struct {
	dir        string
	removeDir  bool
	config     *rest.Config
	kubeconfig string
	etcd       *process
	apiServer  *process
	kcm        *process // nil unless Options.ControllerManager
	// workloads are kube-scheduler and kwok (Options.Workloads).
	workloads []*process
	// startKCM starts kube-controller-manager again: RestartControllerManager.
	startKCM func() (*process, error)

	// How to start kube-apiserver again: RestartAPIServer, AddAPIServer.
	apiServerBin  string
	apiServerArgs []string
	extra         []*process // API servers added by AddAPIServer
}

// adminUser is the identity of the admin token; group system:masters passes
// every authorization check.
const adminUser = "syncloop-admin"

// Start starts etcd and kube-apiserver (and kube-controller-manager when
// asked) and returns once the API server is ready and the default namespace
// exists. On error nothing is left running. Call Stop when done.
func Start(ctx context.Context, opts Options) (*Env, error) {
	// The ports are picked free, then bound by the processes: another
	// process can take one in between. Such a start is tried again, on
	// other ports.
	for attempt := 1; ; attempt++ {
		e, err := start(ctx, opts)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return e, err
		}
	}
}

func start(ctx context.Context, opts Options) (*Env, error) {
	bins := map[string]string{}
	names := []string{etcdBinary, apiServerBinary}
	if opts.Workloads {
		opts.ControllerManager = true
		names = append(names, schedulerBinary)
	}
	if opts.ControllerManager {
		names = append(names, controllerManagerBinary)
	}
	for _, n := range names {
		p, err := findBinary(n)
		if err != nil {
			return nil, err
		}
		bins[n] = p
	}
	if opts.Workloads {
		p, err := Kwok()
		if err != nil {
			return nil, err
		}
		bins["kwok"] = p
	}

	e := &Env{dir: opts.Dir}
	if e.dir == "" {
		d, err := os.MkdirTemp("", "syncloop-testenv-")
		if err != nil {
			return nil, err
		}
		e.dir, e.removeDir = d, true
	} else if err := os.MkdirAll(e.dir, 0o700); err != nil {
		return nil, err
	}
	if err := e.start(ctx, bins, opts); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

func (e *Env) start(ctx context.Context, bins map[string]string, opts Options) error {
	certs, err := newPKI(e.dir)
	if err != nil {
		return fmt.Errorf("creating PKI: %w", err)
	}
	token, err := randomToken()
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(e.dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+","+adminUser+",uid-admin,\"system:masters\"\n"), 0o600); err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	apiPort := ports[2]
	if e.etcd, err = e.startEtcd(bins[etcdBinary], etcdClient, "http://127.0.0.1:"+strconv.Itoa(ports[1])); err != nil {
		return err
	}
	if err := e.startAPIServer(bins[apiServerBinary], etcdClient, apiPort, certs, tokenFile, opts.APIServerArgs); err != nil {
		return err
	}
	e.config = &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(apiPort),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: certs.caCert},
		QPS:             -1, // tests are not throttled client-side; the flow control of the server still applies
	}
	e.kubeconfig = filepath.Join(e.dir, "kubeconfig")
	if err := writeKubeconfig(e.kubeconfig, e.config, adminUser); err != nil {
		return err
	}
	if err := e.waitReady(ctx); err != nil {
		return err
	}
	if opts.ControllerManager {
		controllers := opts.Controllers
		if opts.Workloads {
			if len(controllers) == 0 {
				controllers = defaultControllers
			}
			controllers = append(slices.Clone(controllers), workloadControllers...)
		}
		e.startKCM = func() (*process, error) {
			return e.startControllerManager(bins[controllerManagerBinary], certs, controllers)
		}
		if e.kcm, err = e.startKCM(); err != nil {
			return err
		}
	}
	if opts.Workloads {
		return e.startWorkloads(ctx, bins[schedulerBinary], bins["kwok"])
	}
	return nil
}

// startEtcd starts etcd, serving clients at client.
func (e *Env) startEtcd(bin, client, peer string) (*process, error) {
	return startProcess(e.dir, "etcd", bin,
		"--name=testenv",
		"--data-dir="+filepath.Join(e.dir, "etcd"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=testenv="+peer,
		// Test data is thrown away: skipping fsync makes etcd several times faster.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	)
}

// startAPIServer starts kube-apiserver on port, storing in etcd at etcd,
// with extra arguments after its own.
func (e *Env) startAPIServer(bin, etcd string, port int, certs *pki, tokenFile string, extra []string) error {
	args := []string{
		"--etcd-servers=" + etcd,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certs.servingCert,
		"--tls-private-key-file=" + certs.servingKey,
		// Without it the API server refuses loopback addresses for its own endpoints.
		"--endpoint-reconciler-type=none",
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + certs.saKey,
		"--service-account-signing-key-file=" + certs.saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--allow-privileged=true",
		"--profiling=false",
	}
	e.apiServerBin, e.apiServerArgs = bin, append(args, extra...)
	var err error
	e.apiServer, err = startProcess(e.dir, "kube-apiserver", e.apiServerBin, e.apiServerArgs...)
	return err
}

// startControllerManager starts kube-controller-manager with controllers
// (none given: the garbage collector, namespace and serviceaccount-token,
// which fills the token Secrets of service accounts, as a cluster does —
// the ci-robot example waits for one).
func (e *Env) startControllerManager(bin string, certs *pki, controllers []string) (*process, error) {
	if len(controllers) == 0 {
		controllers = defaultControllers
	}
	return startProcess(e.dir, "kube-controller-manager", bin,
		"--kubeconfig="+e.kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--service-account-private-key-file="+certs.saKey,
		"--root-ca-file="+filepath.Join(e.dir, "ca.crt"),
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
	)
}

// defaultControllers are the controllers kube-controller-manager runs
// unless Options.Controllers says.
var defaultControllers = []string{"garbagecollector", "namespace", "serviceaccount-token"}

// waitReady polls /readyz until the API server reports ready and the default
// namespace exists, failing early if a process exits.
func (e *Env) waitReady(ctx context.Context) error {
	return waitReady(ctx, e.config, e.etcd, e.apiServer)
}

func waitReady(ctx context.Context, cfg *rest.Config, etcd, apiServer *process) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, p := range []*process{etcd, apiServer} {
			if err := p.exitError(); err != nil {
				return false, err
			}
		}
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			last = fmt.Errorf("/readyz: %w: %s", err, body)
			return false, nil
		}
		if _, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{}); err != nil {
			if !apierrors.IsNotFound(err) {
				last = err
			}
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		if wait.Interrupted(err) && last != nil {
			return fmt.Errorf("kube-apiserver not ready: %w; last lines of its log:\n%s", last, apiServer.logTail(20))
		}
		return err
	}
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, as an upgrade or a crashed
// node would) and leaves etcd running: clients see connection errors until
// StartAPIServer. It is for fault tests; use a control plane of the test's
// own (Start), not the shared one.
func (e *Env) StopAPIServer() { e.apiServer.stop(10 * time.Second) }

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port with the same flags and data, and returns once it is ready.
func (e *Env) StartAPIServer(ctx context.Context) error {
	if e.apiServer.exitError() == nil {
		return errors.New("kube-apiserver is running")
	}
	p, err := startProcess(e.dir, "kube-apiserver", e.apiServerBin, e.apiServerArgs...)
	if err != nil {
		return err
	}
	e.apiServer = p
	return e.waitReady(ctx)
}

// RestartControllerManager stops kube-controller-manager and starts it
// again. Its garbage collector finds the kinds the API server serves when
// it starts, and again only every 30 seconds: a test that makes a CRD and
// needs its objects collected restarts it rather than wait.
func (e *Env) RestartControllerManager() error {
	if e.startKCM == nil {
		return errors.New("no kube-controller-manager: Options.ControllerManager")
	}
	e.kcm.stop(10 * time.Second)
	p, err := e.startKCM()
	if err != nil {
		return err
	}
	e.kcm = p
	return nil
}

// AddAPIServer starts another kube-apiserver on the same etcd, as in a
// highly available control plane, and returns an admin config for it and a
// function that stops it. Writes through either server are seen by both.
func (e *Env) AddAPIServer(ctx context.Context) (*rest.Config, func(), error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, nil, err
	}
	args := make([]string, 0, len(e.apiServerArgs))
	for _, a := range e.apiServerArgs {
		if strings.HasPrefix(a, "--secure-port=") {
			a = "--secure-port=" + strconv.Itoa(ports[0])
		}
		args = append(args, a)
	}
	p, err := startProcess(e.dir, fmt.Sprintf("kube-apiserver-%d", len(e.extra)+2), e.apiServerBin, args...)
	if err != nil {
		return nil, nil, err
	}
	e.extra = append(e.extra, p)
	stop := func() { p.stop(10 * time.Second) }
	cfg := rest.CopyConfig(e.config)
	cfg.Host = "https://127.0.0.1:" + strconv.Itoa(ports[0])
	if err := waitReady(ctx, cfg, e.etcd, p); err != nil {
		stop()
		return nil, nil, err
	}
	return cfg, stop, nil
}

// Stop stops the processes (kwok and kube-scheduler,
// kube-controller-manager, kube-apiserver, etcd, in that order) and removes the scratch directory if Start created it. It
// may be called more than once.
func (e *Env) Stop() {
	for _, p := range append(append(append(slices.Clone(e.workloads), e.kcm), e.extra...), e.apiServer, e.etcd) {
		if p != nil {
			p.stop(10 * time.Second)
		}
	}
	if e.removeDir {
		_ = os.RemoveAll(e.dir)
	}
}

// Config returns a copy of the admin rest.Config (group system:masters). The
// caller may change the copy.
func (e *Env) Config() *rest.Config { return rest.CopyConfig(e.config) }

// Kubeconfig is the path of a kubeconfig file for the admin identity.
func (e *Env) Kubeconfig() string { return e.kubeconfig }

// Dir is the scratch directory: etcd data, PKI, process logs.
func (e *Env) Dir() string { return e.dir }

// HasControllerManager reports whether kube-controller-manager runs, so that
// garbage collection and namespace deletion happen.
func (e *Env) HasControllerManager() bool { return e.kcm != nil }

// Healthy reports whether every process still runs.
func (e *Env) Healthy() error {
	var errs []error
	for _, p := range []*process{e.etcd, e.apiServer, e.kcm} {
		if p != nil {
			errs = append(errs, p.exitError())
		}
	}
	return errors.Join(errs...)
}

// WriteKubeconfig writes a kubeconfig file for cfg (a bearer token config
// of this control plane, such as ServiceAccountConfig returns).
func WriteKubeconfig(path string, cfg *rest.Config, user string) error {
	return writeKubeconfig(path, cfg, user)
}

func writeKubeconfig(path string, cfg *rest.Config, user string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["testenv"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: user, Namespace: metav1.NamespaceDefault}
	kc.CurrentContext = "testenv"
	return clientcmd.WriteToFile(*kc, path)
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// FreeAddress returns a loopback host:port that was free a moment ago, for a
// server of the caller's (metrics, probes).
func FreeAddress() (string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(ports[0]), nil
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// They are drawn below Linux's ephemeral range (32768 and up by default):
// a port the kernel hands out — to a listener on port 0, or to an
// outgoing connection, of which the control plane makes many — can be
// taken between this check and the caller's listen, and was: "bind:
// address already in use" for a probe address in CI. A port is handed
// out once per process (a control plane started by one test drew the
// port another test had just been given for its syncloop's metrics, not
// bound yet), and each process draws from its own part of the range, by
// its PID, so that the test binaries of two packages seldom draw alike.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	handed.mu.Lock()
	defer handed.mu.Unlock()
	base := portsFrom + (os.Getpid()%portParts)*(portsSpan/portParts)
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if tries < 100*n {
			port := base + mrand.IntN(portsSpan/portParts)
			if handed.ports[port] {
				continue
			}
			addr = "127.0.0.1:" + strconv.Itoa(port)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if tries < 100*n {
				continue // taken: draw another
			}
			return nil, err
		}
		ls = append(ls, l)
		port := l.Addr().(*net.TCPAddr).Port
		ports = append(ports, port)
		handed.ports[port] = true
	}
	return ports, nil
}

// The ports freePorts draws from: portsSpan from portsFrom, in portParts
// parts, one a process.
const (
	portsFrom = 20000
	portsSpan = 12000
	portParts = 6
)

// handed are the ports freePorts has handed out in this process.
var handed = struct {
	mu    sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// PIDs are the control plane's processes by name (etcd, kube-apiserver,
// kube-controller-manager when it runs), for measuring what they use.
func (e *Env) PIDs() map[string]int {
	out := map[string]int{}
	for _, p := range []*process{e.etcd, e.apiServer, e.kcm} {
		if p != nil && p.cmd.Process != nil {
			out[p.name] = p.cmd.Process.Pid
		}
	}
	return out
}
