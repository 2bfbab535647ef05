// Package manager assembles a running syncloop: newProcess builds every
// piece — API clients, metrics, the rule files with their loader and
// reload (rulefiles.go), the keeper of the CRDs of the kinds rules define
// (crds.go: applied before a rule set is put in force, never deleted),
// Events, the mode, the engine, the listeners of /metrics and the probes —
// and start starts them in order: Events and servers, the CRD watch and the
// first load of the rule files, their watcher, then the mode, which runs
// the engine. The modes — Single,
// LeaderElection (one replica works, the others stand by) or Sharding
// (replicas share the triggers) — are interchangeable wrappers around the
// engine, in the manner of controller-runtime's manager and its
// runnables; a mode is given what it needs (runner), not the process.
//
// Beside the process, two passes over the cluster use the same pieces:
// Plan (one reconcile of every trigger, as dry-run requests) and Trace
// (one trigger rendered against the cluster as it is, writing nothing:
// trace.go, tracechildren.go).
//
// It owns the process's wiring and nothing of what a rule does (package
// rules), how a rule is reconciled (package engine) or how shard members
// agree on who has which trigger (package internal/shard). Command-line
// flags are not its business either: package main turns them into
// Options.
package manager
