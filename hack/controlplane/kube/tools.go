//go:build tools

// Package kube pins the Kubernetes modules that hack/testenv.sh builds
// kube-apiserver and kube-controller-manager from. It is a scratch module:
// nothing in syncloop imports it. Importing the commands' app packages keeps
// every dependency of both binaries in go.mod and go.sum through `go mod tidy`.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)
