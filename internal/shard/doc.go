// Package shard is the membership protocol of sharded replicas: each
// member of a group holds a Lease of its own, renews it, publishes the
// view (the members) it works under, removes the Leases of members that
// stopped renewing, and hands triggers over when the members change —
// stopping the triggers it loses and waiting for their reconciles before
// it publishes the view that gives them away. Which triggers a member may
// work on (an assignment: rendezvous hashing over the views) is what it
// gives the engine as its engine.Shard. docs/how-it-works.md ("Sharding")
// tells the protocol and why it never lets two members write one trigger.
//
// It owns the Leases of its group and nothing else: it neither builds
// clients nor serves probes (internal/manager does, and turns Status into
// /readyz), and what a member does with its triggers is the engine's. It
// does not end the process itself: a member that can no longer be sure
// that no other one writes what it would calls Config.Lost.
package shard
