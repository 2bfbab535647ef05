package manager

import (
	"context"
	"io"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/rules"
)

// PlanOptions say how Plan prints and where it looks.
type PlanOptions struct {
	// Namespace, when set, limits the plan to one namespace
	// (engine.Options.Namespace).
	Namespace string
	// JSON prints one JSON object per action instead of text.
	JSON bool
	// Stdout gets the actions and the summary, Stderr what failed.
	Stdout, Stderr io.Writer
}

// Plan computes, with server-side dry-run requests, what one reconcile of
// every trigger of every rule in set would do now, prints it, and returns
// how many actions and failed triggers it found. An error means a rule
// could not be planned at all.
func Plan(ctx context.Context, c *Clients, set *rules.Set, o PlanOptions) (actions, failures int, err error) {
	printer := engine.NewPlanPrinter(o.Stdout, o.Stderr, o.JSON, false)
	eng := engine.New(engine.Options{Client: c.Dynamic, Mapper: c.Mapper, Plan: printer, Namespace: o.Namespace})
	if err := eng.PlanOnce(ctx, set); err != nil {
		return 0, 0, err
	}
	actions, failures = printer.Summary()
	return actions, failures, nil
}
