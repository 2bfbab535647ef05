//go:build !linux

package testenv

import "syscall"

// sysProcAttr: without Linux's parent-death signal, processes are stopped by
// Env.Stop and by Main's signal handler only.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
