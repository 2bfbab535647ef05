// Package dynamic is syncloop's client-go layer for resources it learns about
// at run time: a discovery-backed RESTMapper that refreshes on a miss, a
// registry of shared informers keyed by WatchKey (refcounted, stoppable one by
// one, managedFields stripped before caching), and server-side apply, status
// and delete helpers.
//
// It imports only client-go and apimachinery: it knows nothing about rules,
// templates or reconcile.
package dynamic
