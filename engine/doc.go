// Package engine owns every goroutine of a running syncloop: the rule set
// in force (engine.go, Enforce), and per rule
//
//   - a loop (loop.go, ruleLoop): the rule's kinds and informers
//     (watches.go), a rate-limited workqueue of trigger keys fed by their
//     events (handlers.go), the rule's workers (worker.go: the gates, the
//     reconcile, and what becomes of the key), the periodic resync, the
//     sweep for orphans, and the triggers its replica's shard owns
//     (shard.go);
//   - a reconciler (reconcile.go, prune.go, status.go, patch.go) that does
//     what one trigger's reconcile does: read the trigger from the cache,
//     render, server-side apply what differs, prune, release patches,
//     write status. It reads only what a reconcile reads (the rule, its
//     mappings and caches) and is testable without informers;
//   - a writer (writer.go) through which the reconciler makes every write:
//     the live writer sends them, counts them and emits Events; a dry run's
//     writer sends dry-run requests and records the plan (plan.go) — the
//     reconcile has one path for both. New picks live or plan outputs
//     (outputs.go) once: writers, rollout records, removal records;
//   - during a rollout of a changed rule, the coordinator (package
//     engine/rollout) that says which revision each trigger is on and
//     steps the rollout, through rollout.Host (rollout.go);
//   - the memory of its own writes (writes.go), so that their echoes cost
//     nothing.
//
// Run returns only after everything it started has stopped.
//
// It imports rules (what to do) and dynamic (how to reach the cluster); it
// does not parse rule files, build clients, serve probes or elect leaders
// (internal/manager does), and talks to the API server only through
// dynamic. Metrics reach it through the Metrics interface, a shard through
// Shard, a plan through Planner: interfaces on this side.
package engine
