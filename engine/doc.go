// Package engine owns every goroutine of a running syncloop: the rule set in
// force, one controller per rule with its workqueue and workers, and the
// reconcile loop — read the trigger from the cache, render, server-side
// apply what differs, prune, write status, emit Events. Run returns only
// after everything it started has stopped.
//
// It imports rules (what to do) and dynamic (how to reach the cluster); it
// does not parse rule files, and talks to the API server only through
// dynamic. Metrics reach it through the Metrics interface.
package engine
