//go:build tools

// Package tools pins krew, kubectl's plugin manager, which the tests use to
// install syncloop from the krew manifest `make krew` writes, as a user's
// `kubectl krew install` would (hack/testenv.sh builds it).
package tools

import _ "sigs.k8s.io/krew/cmd/krew"
