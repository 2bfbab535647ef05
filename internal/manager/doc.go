// Package manager assembles a running syncloop: API clients, metrics, health
// probes, the rule files and their reload, CRD watching, Events, and the
// engine, run in one of three modes — Single, LeaderElection (one replica
// works, the others stand by) or Sharding (replicas share the triggers, on
// Leases). The modes are interchangeable wrappers around the engine, in the
// manner of controller-runtime's manager and its runnables.
//
// It owns the process's wiring and nothing of what a rule does (package
// rules) or how a rule is reconciled (package engine). Command-line flags
// are not its business either: package main turns them into Options.
package manager
