//go:build tools

// Package tools pins kwok (sigs.k8s.io/kwok), which hack/testenv.sh builds
// for the local control plane: it plays the kubelet of fake nodes, so
// Pods become Running and Ready.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
