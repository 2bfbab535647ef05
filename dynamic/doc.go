// Package dynamic is syncloop's client-go layer for resources it learns about
// at run time: the Client (a dynamic client and the REST client beneath it),
// FlowControl, which fits the requests in flight to what the API server
// accepts, a discovery-backed RESTMapper that refreshes on a miss, a registry
// of shared informers keyed by WatchKey (refcounted, stoppable one by one,
// built-in kinds read in protobuf, ConfigMaps and Secrets cached as their
// typed objects, managedFields stripped and strings interned before
// caching), and
// server-side apply, status and delete helpers.
//
// It imports only client-go, apimachinery and k8s.io/utils (a clock, so that
// flow control is tested with a fake one): it knows nothing about rules,
// templates or reconcile.
package dynamic
