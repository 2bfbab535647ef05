//go:build tools

// Package etcd pins the etcd server module that hack/testenv.sh builds.
// It is a scratch module: nothing in syncloop imports it.
package etcd

import _ "go.etcd.io/etcd/server/v3/etcdmain"
