package testenv

import "syscall"

// sysProcAttr makes the kernel kill a control plane process when the test
// binary that started it dies, however it dies (a panic, a go test timeout, a
// SIGKILL): no etcd or kube-apiserver may outlive its tests.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
