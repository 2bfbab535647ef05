package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules/render"
)

// writeStatus server-side applies the rule's status and the Ready
// condition to the trigger's status subresource, unless the trigger's
// status already holds them. rd is nil when rendering failed, failure the
// error of a reconcile that failed: the condition then says
// ReconcileFailed. The rule's status fields are rendered from rd — a
// child whose apply failed read as it is (render.Applier.Observed) — and keep
// the values they have when there is no rd or they do not render.
func (rc *reconciler) writeStatus(ctx context.Context, trigger *unstructured.Unstructured, rd *render.Rendered, failure error) error {
	var rendered map[string]any
	var cond render.Condition
	var statusErr error // the rule's status failed to render: still an error once the condition says so
	if rd != nil {
		if rd.Skipped {
			return nil
		}
		if rendered, statusErr = rd.Status(ctx); statusErr != nil {
			failure = errors.Join(failure, statusErr)
		}
		cond = rd.Readiness()
	}
	if failure != nil {
		cond = render.Failed(failure)
	}
	return rc.applyStatus(ctx, trigger, rendered, cond, statusErr)
}

// applyStatus applies rendered, the rule's status fields (nil: keep
// those the trigger has), and cond as the Ready condition to trigger's
// status, unless it holds them already, and returns statusErr, the
// failure of the status's render.
func (rc *reconciler) applyStatus(ctx context.Context, trigger *unstructured.Unstructured, rendered map[string]any, cond render.Condition, statusErr error) error {
	// desired is the status to write over current.
	desired := func(current map[string]any) map[string]any {
		status := maps.Clone(rendered)
		if status == nil { // failed, or waits for a lookup: keep the fields the rule writes as they are
			status = map[string]any{}
			for k, v := range current {
				if k != "conditions" && rc.rule.WritesStatusField(k) {
					status[k] = v
				}
			}
		}
		status["conditions"] = cond.Conditions(current["conditions"], status["conditions"], trigger.GetGeneration(), time.Now())
		return status
	}
	current, _ := trigger.Object["status"].(map[string]any)
	status := desired(current)
	if holds(current, status) {
		return statusErr
	}
	if rc.mayLag(cache.ObjectName{Namespace: trigger.GetNamespace(), Name: trigger.GetName()}) {
		// Just handed over: the previous owner may have written this
		// status a moment ago (see handoverVerify).
		if live, err := rc.client.Get(ctx, rc.w.triggerMapping, trigger.GetNamespace(), trigger.GetName()); err == nil {
			current, _ = live.Object["status"].(map[string]any)
			if status = desired(current); holds(current, status) {
				return statusErr
			}
		}
	}
	patch := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": trigger.GetAPIVersion(),
		"kind":       trigger.GetKind(),
		"metadata":   map[string]any{"name": trigger.GetName(), "namespace": trigger.GetNamespace()},
		"status":     status,
	}}
	if trigger.GetNamespace() == "" {
		delete(patch.Object["metadata"].(map[string]any), "namespace")
	}
	if err := rc.out.status(ctx, rc.w.triggerMapping, trigger, patch, rc.rule.FieldManager()); err != nil {
		return errors.Join(statusErr, fmt.Errorf("writing status: %w", err))
	}
	return statusErr
}
