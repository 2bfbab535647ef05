// Package engine owns every goroutine of a running syncloop: the rule set in
// force, one RuleController per rule with its workqueue and workers, and the
// reconcile loop — read the trigger from the cache, render, server-side
// apply, prune, write status, emit Events. Dry-run is an applier that prints
// plans instead of writing.
//
// It imports rules (what to do) and dynamic (how to reach the cluster); it
// does not parse rule files nor talk to the API server except through
// dynamic.
package engine
