package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/internal/printable"
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
	// Revisions, when set, compiles the rules' recorded revisions: a rule
	// that differs from its newest revision in SyncloopNamespace (of
	// Installation) is planned as its rollout would go — the first step,
	// or the step a rollout under way has reached.
	Revisions         *rules.Loader
	SyncloopNamespace string
	Installation      string
	// Clusters say where the kubeconfig Secrets of the cluster inventory
	// are, and what they may do: the children rules put in those
	// clusters are planned there, as run would reach them.
	Clusters Clusters
	// Progress, when set, is called every ProgressInterval while the
	// triggers are planned: how many are done and how many are queued.
	Progress func(planned, queued int64)
}

// ProgressInterval is how often Plan reports its progress.
const ProgressInterval = 250 * time.Millisecond

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
	inventory := newInventory(c, o.Clusters, o.SyncloopNamespace, nil, nil)
	ictx, stopInventory := context.WithCancel(ctx)
	defer stopInventory()
	runInventory(ictx, inventory) // it lists only if a rule targets clusters
	eo := engine.Options{Client: c.Dynamic, Mapper: c.Mapper, Plan: printer, Namespace: o.Namespace, Fleet: inventory}
	if o.Revisions != nil {
		k := newRevisionKeeper(c, o.SyncloopNamespace, o.Installation)
		k.compile = compileRevision(o.Revisions)
		if _, err := k.list(ctx); err != nil {
			fmt.Fprintln(o.Stderr, printable.Block(fmt.Sprintf("warning: cannot read the rules' revisions in namespace %s (%v): changed rules are planned as if every trigger moved at once", o.SyncloopNamespace, err), "  "))
		} else {
			eo.Rollouts = k
		}
	}
	eng := engine.New(eo)
	stop := reportProgress(eng, o.Progress)
	err = eng.PlanOnce(ctx, set)
	stop()
	if err != nil {
		return 0, 0, err
	}
	for _, r := range eng.PlanRollouts() {
		printRollout(o, r)
	}
	actions, failures = printer.Summary()
	return actions, failures, nil
}

// reportProgress calls progress with eng's progress every
// ProgressInterval until stop is called, and once more then, with where
// the plan ended; stop returns after that last call.
func reportProgress(eng *engine.Engine, progress func(planned, queued int64)) (stop func()) {
	if progress == nil {
		return func() {}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(ProgressInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				progress(eng.Progress())
				return
			case <-tick.C:
				progress(eng.Progress())
			}
		}
	}()
	return func() { close(done); <-finished }
}

// reachedClusters names the clusters a rollout by cluster has reached.
func reachedClusters(names []string) string {
	if len(names) == 0 {
		return "syncloop's own cluster alone"
	}
	return "syncloop's own cluster and cluster " + strings.Join(names, ", ")
}

// printRollout says, in a plan, how a changed rule rolls out: the step
// planned and how many follow, or why the rollout halts.
func printRollout(o PlanOptions, r rollout.Status) {
	if o.JSON {
		ro := map[string]any{"rule": r.Rule, "state": r.State, "step": r.Step, "steps": r.Steps,
			"moved": r.Moved, "total": r.Total, "from": r.From, "to": r.To, "reason": r.Reason, "message": r.Message}
		if r.ByCluster {
			ro["clusters"] = r.Reached
		}
		data, _ := json.Marshal(map[string]any{"rollout": ro})
		fmt.Fprintf(o.Stdout, "%s\n", data)
		return
	}
	var line string
	switch {
	case r.State == rollout.Progressing && r.ByCluster:
		line = fmt.Sprintf("Rollout of rule %s to revision %s by cluster: step %d of %d, every trigger on it in %s (planned below); %d steps follow, each once the clusters before are healthy.",
			r.Rule, shortHash(r.To), r.Step, r.Steps, reachedClusters(r.Reached), r.Steps-r.Step)
	case r.State == rollout.Progressing:
		line = fmt.Sprintf("Rollout of rule %s to revision %s: step %d of %d, %d of %d triggers on it (planned below); %d steps follow, each once the one before is healthy.",
			r.Rule, shortHash(r.To), r.Step, r.Steps, r.Moved, r.Total, r.Steps-r.Step)
	default:
		line = fmt.Sprintf("Rollout of rule %s to revision %s: %s at step %d of %d, %d of %d triggers on it", r.Rule, shortHash(r.To), r.State, r.Step, r.Steps, r.Moved, r.Total)
		if r.Message != "" {
			line += ": " + r.Message
		}
		line += "."
	}
	// The clusters' names and the message are the cluster's.
	fmt.Fprintln(o.Stdout, printable.Text(line))
}
