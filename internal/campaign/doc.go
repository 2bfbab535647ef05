// Package campaign runs syncloop through a randomized fault campaign, in
// the spirit of etcd's robustness tests and Jepsen, and judges it by the
// API server's audit log rather than by what syncloop says of itself.
//
// A campaign starts a control plane of its own with an audit policy that
// records every write syncloop's identities make, and runs syncloop —
// one replica, a leader-elected pair or three sharded replicas, each
// start an incarnation acting as a ServiceAccount of its own — through a
// proxy that injects faults into its requests (connections reset before
// and after the API server answered, 500s, 503s, 429s, latency, watches
// cut mid-stream or answered 410 Gone), while replicas are SIGKILLed and
// restarted, kube-apiserver is restarted and etcd compacts. Meanwhile a
// workload creates, changes and deletes triggers and a lookup source,
// edits and breaks the rule file, changes children as another writer
// would and puts objects of someone else's under children's names; it
// keeps the history of what the rule wanted after each change, computed
// by the offline renderer (the model).
//
// Then the faults stop and the campaign judges: syncloop converges to
// what the model wants of the final objects; it wrote nothing it does not
// own; no two incarnations wrote one trigger's children in turns; no
// child was deleted while wanted; its writes are bounded by the changes
// plus the writes the proxy failed. Everything random comes from the
// seed, which a report prints, so that a failing campaign replays.
//
// It knows nothing of syncloop's insides: it runs a binary.
package campaign
