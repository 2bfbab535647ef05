package engine

import (
	"context"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/syncloop/syncloop/dynamic"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

// outputs are where the engine's decisions go: to the cluster, its Events
// and the rollout store, or — in a dry run — to the plan. New picks one
// (PlanOnce its own) and nothing downstream tells them apart: this is the
// one place a dry run is decided.
type outputs struct {
	// plan is the dry run's; nil when the engine is live.
	plan Planner
	// writer makes rule r's writer, writing with client (the identity's,
	// or in another cluster of the fleet, that cluster's: "" syncloop's).
	writer func(r *rules.Rule, cluster string, client *dynamic.Writer, writes *ownWrites, requeue func(cache.ObjectName)) writer
	// rollouts makes the recorder of a rollout of r; coordinates says
	// whether this replica steps it.
	rollouts func(r *rules.Rule, coordinates func() bool) rollout.Recorder
	// removed records what removing r did.
	removed func(ctx context.Context, r *rules.Rule, rec RemovalRecord, eventType, reason string)
}

// liveOutputs write to the cluster: Events as events says, through
// recorder; rollouts and removals to store (nil: kept in memory only).
func liveOutputs(m Metrics, recorder record.EventRecorder, events EventMode, store RolloutStore) outputs {
	return outputs{
		writer: func(r *rules.Rule, cluster string, client *dynamic.Writer, writes *ownWrites, requeue func(cache.ObjectName)) writer {
			return &liveWriter{rule: r.Name, cluster: cluster, client: client, writes: writes, requeue: requeue,
				metrics: m, recorder: recorder, events: events}
		},
		rollouts: func(r *rules.Rule, coordinates func() bool) rollout.Recorder {
			return storedRollout{store: store, rule: r, coordinates: coordinates}
		},
		removed: func(ctx context.Context, r *rules.Rule, rec RemovalRecord, eventType, reason string) {
			if store != nil {
				store.RecordRemoval(ctx, r, rec, eventType, reason, rec.Message)
			}
		},
	}
}

// planOutputs are a dry run's: every write a dry-run request and an
// Action for plan, rollout transitions told to it, nothing recorded, no
// Event; once, a trigger that fails is not retried.
func planOutputs(plan Planner, once bool) outputs {
	return outputs{
		plan: plan,
		writer: func(r *rules.Rule, cluster string, client *dynamic.Writer, _ *ownWrites, _ func(cache.ObjectName)) writer {
			return &planWriter{rule: r.Name, cluster: cluster, client: client, plan: plan, once: once}
		},
		rollouts: func(r *rules.Rule, _ func() bool) rollout.Recorder {
			return plannedRollout{plan: plan, rule: r.Name}
		},
		removed: func(context.Context, *rules.Rule, RemovalRecord, string, string) {},
	}
}
