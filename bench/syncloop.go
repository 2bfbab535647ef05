package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

// syncloopRun is `syncloop run` as a process of its own, serving /metrics
// and the probes on free addresses, its output in a file.
type syncloopRun struct {
	cmd             *exec.Cmd
	metrics, probes string
	logPath         string
	done            chan struct{} // closed when the process has exited; err is set then
	err             error
	stopped         bool
}

// startSyncloop starts bin run -f rulesDir as kubeconfig, with extra
// flags, its output going to logPath.
func startSyncloop(bin, rulesDir, kubeconfig, logPath string, extra ...string) (*syncloopRun, error) {
	p := &syncloopRun{logPath: logPath, done: make(chan struct{})}
	var err error
	if p.metrics, err = testenv.FreeAddress(); err != nil {
		return nil, err
	}
	if p.probes, err = testenv.FreeAddress(); err != nil {
		return nil, err
	}
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append([]string{"run", "-f", rulesDir, "--kubeconfig", kubeconfig,
		"--metrics-bind-address", p.metrics, "--health-probe-bind-address", p.probes}, extra...)
	p.cmd = exec.Command(bin, args...)
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
		return fmt.Errorf("syncloop exited: %v; its last output:\n%s", p.err, p.lastOutput())
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
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(time.Minute):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("syncloop did not stop within a minute of SIGTERM")
	}
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
