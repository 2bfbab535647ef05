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
	// NoManageCRDs: the CRDs of the kinds rules define are not syncloop's
	// to write (run --manage-crds=false); they are not planned.
	NoManageCRDs bool
}

// CRDSource reads the cluster's CRDs for a rule load that checks the kinds
// rules define against them (rules.Loader.UseServedCRDs), as run does.
func CRDSource(c *Clients, manage bool) rules.CRDSource { return newCRDKeeper(c, manage) }

// Plan computes, with server-side dry-run requests, what one reconcile of
// every trigger of every rule in set would do now, prints it, and returns
// how many actions and failed triggers it found. An error means a rule
// could not be planned at all.
func Plan(ctx context.Context, c *Clients, set *rules.Set, o PlanOptions) (actions, failures int, err error) {
	printer := engine.NewPlanPrinter(o.Stdout, o.Stderr, o.JSON, false)
	// A rule whose CRD is to be created has no triggers yet.
	created := newCRDKeeper(c, !o.NoManageCRDs).plan(set, printer)
	set = set.Only(func(r *rules.Rule) bool { return !created[r.Name] })
	eng := engine.New(engine.Options{Client: c.Dynamic, Mapper: c.Mapper, Plan: printer, Namespace: o.Namespace})
	if err := eng.PlanOnce(ctx, set); err != nil {
		return 0, 0, err
	}
	actions, failures = printer.Summary()
	return actions, failures, nil
}
