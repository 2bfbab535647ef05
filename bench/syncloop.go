package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

// syncloopRun is `syncloop run` (or the hand-written tenant controller) as
// a process of its own, serving /metrics (and syncloop the probes) on free
// addresses, its output in a file.
type syncloopRun struct {
	cmd             *exec.Cmd
	metrics, probes string
	logPath         string
	done            chan struct{} // closed when the process has exited; err is set then
	err             error
	// terminated: SIGTERM sent (only once: a second one, after syncloop
	// has finished its shutdown and restored the signal's default, would
	// kill it); stopped: stop called.
	terminated, stopped bool
}

// startSyncloop starts bin run -f rulesDir as kubeconfig, with extra
// flags, its output going to logPath.
func startSyncloop(bin, rulesDir, kubeconfig, logPath string, extra ...string) (*syncloopRun, error) {
	metrics, err := testenv.FreeAddress()
	if err != nil {
		return nil, err
	}
	probes, err := testenv.FreeAddress()
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "-f", rulesDir, "--kubeconfig", kubeconfig,
		"--metrics-bind-address", metrics, "--health-probe-bind-address", probes}, extra...)
	p, err := startMeasured(exec.Command(bin, args...), metrics, logPath)
	if p != nil {
		p.probes = probes
	}
	return p, err
}

// startHandTenants starts the hand-written tenant controller — this
// binary again, made that controller by handTenantsEnv — on the Tenants
// of ns as kubeconfig, its output going to logPath.
func startHandTenants(kubeconfig, ns, logPath string) (*syncloopRun, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	metrics, err := testenv.FreeAddress()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-kubeconfig", kubeconfig, "-namespace", ns, "-metrics-bind-address", metrics)
	cmd.Env = append(os.Environ(), handTenantsEnv+"=1")
	return startMeasured(cmd, metrics, logPath)
}

// startMeasured starts cmd, which serves /metrics on metrics, its output
// going to logPath.
func startMeasured(cmd *exec.Cmd, metrics, logPath string) (*syncloopRun, error) {
	p := &syncloopRun{cmd: cmd, metrics: metrics, logPath: logPath, done: make(chan struct{})}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports, without waiting, whether the process has ended, and
// then why with its last output.
func (p *syncloopRun) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %v; its last output:\n%s", filepath.Base(p.cmd.Path), p.err, p.lastOutput())
	default:
		return nil
	}
}

// stop sends SIGTERM and waits up to a minute for the process to exit
// (then kills it); it returns how the process ended. Only the first call
// stops it.
func (p *syncloopRun) stop() error {
	if p.stopped {
		return nil
	}
	p.stopped = true
	p.terminate()
	select {
	case <-p.done:
		return p.err
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within a minute of SIGTERM", filepath.Base(p.cmd.Path))
	}
}

// terminate sends the process SIGTERM, once.
func (p *syncloopRun) terminate() {
	if !p.terminated {
		p.terminated = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// stopAll tells every process to stop, then waits for each, so that
// sharded replicas leave together and hand nothing over; it returns how
// the first that failed ended.
func stopAll(procs []*syncloopRun) error {
	for _, p := range procs {
		p.terminate()
	}
	var first error
	for i, p := range procs {
		if err := p.stop(); err != nil && first == nil {
			first = fmt.Errorf("process %d exited with %v", i, err)
		}
	}
	return first
}

// scrape reads the process's /metrics.
func (p *syncloopRun) scrape(ctx context.Context) (map[string]float64, error) {
	return scrapeMetrics(ctx, "http://"+p.metrics+"/metrics")
}

// status is the process's /proc status file.
func (p *syncloopRun) status() string { return fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid) }

func (p *syncloopRun) lastOutput() string {
	out, _ := os.ReadFile(p.logPath)
	return lastLines(string(out), 20)
}
