// Package testenv starts a real, local Kubernetes control plane — etcd,
// kube-apiserver and, when asked, kube-controller-manager, and for
// workloads kube-scheduler and kwok (the kubelet of a fake Node) — on
// loopback, for syncloop's integration tests and its demo.
//
// It owns the processes it starts, their scratch directory, the PKI they use
// (a throwaway CA, serving certificate and service-account key) and an admin
// identity (a bearer token in group system:masters). It hands out rest.Configs:
// the admin one, and configs for ServiceAccounts or impersonated users whose
// rights RBAC decides, for tests of least privilege.
//
// It does not build the binaries: hack/testenv.sh does, into a cache outside
// the checkout (the README says where). This package finds them there, or in
// $KUBEBUILDER_ASSETS, binary by binary.
//
// It knows nothing about syncloop's rules or engine. Test packages use it
// through Main and Get, which run one control plane per test binary:
//
//	func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}) }
//
//	func TestSomething(t *testing.T) {
//		env := testenv.Get(t) // skips under -short
//		...
//	}
//
// Every process is started with a parent-death signal, so none outlives the
// test binary even when it is killed.
package testenv
