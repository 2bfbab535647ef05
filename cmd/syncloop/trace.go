package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/printable"
)

func newTraceCommand() *cobra.Command {
	var (
		rf                ruleFlags
		cf                clusterFlags
		namespace         string
		syncloopNamespace string
		output            string
		events            int
		watch             bool
		timeout           time.Duration
	)
	cmd := &cobra.Command{
		Use:   "trace KIND[.GROUP] NAME [-n NAMESPACE] [-o text|wide|json|yaml]",
		Short: "Show what syncloop made of one trigger, and why it waits, from the cluster",
		Long: `trace reads one trigger from the cluster, and the rules that match it — the
newest revision of each rule syncloop recorded in --syncloop-namespace (for a
trigger a rollout has not moved yet, the revision it is on), or the rules
given with -f — and renders each as a reconcile would, writing nothing: every
resource and its child (synced or drifted and on which field, ready or the
readyWhen that is false, waiting for which resource or required lookup, in
conflict with which object, excluded by its when), the children there that
the rule no longer wants (a running syncloop prunes them), each lookup and
what it found, the trigger's conditions and status, and its last Events.

It needs no syncloop running. It reads the trigger, each child (the
trigger's children by their labels, one list per kind; others by name), the
lookups, the revisions and the Events: nothing else. For a rule whose
children go to the clusters of a fleet, it reads the kubeconfig Secrets in
--clusters-namespace and each child there the same way; a cluster that
does not answer shows its children as not reachable.

As a kubectl plugin (the binary installed as kubectl-syncloop on PATH):
kubectl syncloop trace app web -n shop.

With --watch it traces again every second until every resource is ready,
redrawing the tree in place on a terminal (elsewhere, printing each report
that differs from the one before), and exits 0 then, or 3 once --timeout
has passed.

Exit status: 0 when every resource is ready, 3 when one is not, 1 on error.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !slices.Contains([]string{"text", "wide", "json", "yaml"}, output) {
				return fmt.Errorf("--output must be text, wide, json or yaml, not %q", output)
			}
			rf.home = cmp.Or(syncloopNamespace, cf.namespace())
			o := manager.TraceOptions{Resource: args[0], Name: args[1], Namespace: cmp.Or(namespace, cf.namespace()),
				SyncloopNamespace: rf.home, Installation: rf.installation, Events: events, Clusters: cf.clusters}
			return runTrace(cmd, &rf, &cf, o, output, watch, timeout)
		},
	}
	cmd.Flags().StringArrayVarP(&rf.paths, "rules", "f", nil, "rule file or directory to trace with (repeatable; default: the rules' revisions in the cluster)")
	rf.registerInstallation(cmd)
	cf.registerKubeconfig(cmd)
	cf.registerClustersNamespace(cmd)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "the trigger's namespace (default: the kubeconfig context's)")
	cmd.Flags().StringVar(&syncloopNamespace, "syncloop-namespace", "", "syncloop's namespace (run's --leader-elect-namespace), where the rules' revisions are (default: the kubeconfig context's)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text, wide (ages, UIDs, messages whole), json or yaml")
	cmd.Flags().IntVar(&events, "events", 5, "how many of the trigger's last Events to show")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "trace again every second until every resource is ready")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --watch: give up (exit 3) after this long; 0: wait until interrupted")
	return cmd
}

// writeTrace prints rep in format.
func writeTrace(w io.Writer, rep *manager.TraceReport, format string, now time.Time) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	case "yaml":
		data, err := printable.YAML(rep)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}
	t := &traceTable{wide: format == "wide", now: now}
	t.tree(rep)
	return t.flush(w, rep)
}

// traceTable is trace's text output: a tree, in columns.
type traceTable struct {
	wide bool
	now  time.Time
	rows [][]string
}

// maxStatus is how much of a message a text row shows.
const maxStatus = 100

// row adds a row of the tree. Each cell is one line of one column,
// whatever the cluster or the rule put in its values: every cell is
// made printable (a value's newline, tab or escape sequence is shown
// escaped, never acted on).
func (t *traceTable) row(name, synced, ready, status string, obj *manager.TraceObject, updated time.Time) {
	status = printable.Text(status)
	if !t.wide && len([]rune(status)) > maxStatus {
		status = string([]rune(status)[:maxStatus-1]) + "…"
	}
	r := []string{name, synced, ready, status}
	if t.wide {
		age, upd, uid := "-", "-", "-"
		if obj != nil && !obj.Created.IsZero() {
			age = duration.HumanDuration(t.now.Sub(obj.Created))
		}
		if !updated.IsZero() {
			upd = duration.HumanDuration(t.now.Sub(updated)) + " ago"
		}
		if obj != nil && obj.UID != "" {
			uid = obj.UID
		}
		r = append(r, age, upd, uid)
	}
	for i := range r {
		r[i] = printable.Text(r[i])
	}
	t.rows = append(t.rows, r)
}

// tree lays the trigger, its rules, lookups, resources and children out
// as rows.
func (t *traceTable) tree(rep *manager.TraceReport) {
	trig := rep.Trigger
	ready, status := readyCondition(rep)
	t.row(fmt.Sprintf("%s/%s", trig.Kind, trig.Name)+nsSuffix(trig.Namespace), "-", ready, status, &trig, time.Time{})
	for i, rt := range rep.Rules {
		branch, indent := "├─ ", "│  "
		if i == len(rep.Rules)-1 {
			branch, indent = "└─ ", "   "
		}
		t.row(branch+ruleTitle(rt), "-", boolWord(rt.Ready), ruleStatus(rt), nil, time.Time{})
		type item struct {
			name, synced, ready, status string
			obj                         *manager.TraceObject
			updated                     time.Time
			children                    []manager.ChildTrace
		}
		var items []item
		for _, l := range rt.Lookups {
			found := "found " + strings.Join(l.Found, ", ")
			if len(l.Found) == 0 {
				found = "found nothing"
				if l.Required {
					found += " (required)"
				}
			}
			items = append(items, item{name: fmt.Sprintf("lookup %s: %s %s", l.ID, l.Kind, l.Query), synced: "-", ready: "-", status: found})
		}
		for _, res := range rt.Resources {
			it := item{name: "resource " + res.ID, synced: "-", ready: "-", status: res.State, children: res.Children}
			if res.State != manager.TraceWaiting && res.State != manager.TraceExcluded {
				it.ready = boolWord(res.State == manager.TraceReady)
			}
			if res.Why != "" {
				it.status += ": " + res.Why
			}
			items = append(items, it)
		}
		if len(rt.Undesired) > 0 {
			items = append(items, item{name: "not wanted by the rule", synced: "-", ready: "-", status: "a running syncloop prunes these (orphans them, by deletionPolicy Orphan)", children: rt.Undesired})
		}
		for j, it := range items {
			b, in := indent+"├─ ", indent+"│  "
			if j == len(items)-1 {
				b, in = indent+"└─ ", indent+"   "
			}
			t.row(b+it.name, it.synced, it.ready, it.status, it.obj, it.updated)
			for k, ch := range it.children {
				cb := in + "├─ "
				if k == len(it.children)-1 {
					cb = in + "└─ "
				}
				obj := ch.TraceObject
				t.row(cb+fmt.Sprintf("%s/%s", ch.Kind, ch.Name)+whereSuffix(ch.Namespace, ch.Cluster), childSynced(ch), "-", childStatus(ch), &obj, ch.Updated)
			}
		}
	}
}

func (t *traceTable) flush(w io.Writer, rep *manager.TraceReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "NAME\tSYNCED\tREADY\tSTATUS"
	if t.wide {
		head += "\tAGE\tUPDATED\tUID"
	}
	fmt.Fprintln(tw, head)
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Conditions) > 0 {
		fmt.Fprintln(w, "\nConditions:")
		for _, c := range rep.Conditions {
			line := fmt.Sprintf("  %s=%s", c.Type, c.Status)
			if c.Reason != "" {
				line += " " + c.Reason
			}
			if c.Message != "" {
				line += ": " + c.Message
			}
			if t.wide && !c.Since.IsZero() {
				line += fmt.Sprintf(" (%s ago)", duration.HumanDuration(t.now.Sub(c.Since)))
			}
			fmt.Fprintln(w, printable.Text(line))
		}
	}
	if len(rep.Events) > 0 {
		fmt.Fprintln(w, "\nEvents:")
		for _, e := range rep.Events {
			line := fmt.Sprintf("  %s %s: %s", e.Type, e.Reason, e.Message)
			if e.Count > 1 {
				line += fmt.Sprintf(" (x%d)", e.Count)
			}
			if t.wide {
				line = fmt.Sprintf("  %s ago", duration.HumanDuration(t.now.Sub(e.Last))) + line
			}
			fmt.Fprintln(w, printable.Text(line))
		}
	}
	return nil
}

// readyCondition is the trigger's Ready condition as a row shows it; "-"
// when it has none.
func readyCondition(rep *manager.TraceReport) (ready, status string) {
	for _, c := range rep.Conditions {
		if c.Type == "Ready" {
			return c.Status, strings.TrimPrefix(c.Reason+": "+c.Message, ": ")
		}
	}
	return "-", ""
}

func ruleTitle(rt manager.RuleTrace) string {
	s := "rule " + rt.Rule
	if rt.Revision > 0 {
		s += fmt.Sprintf(" revision %d", rt.Revision)
	}
	return s
}

func ruleStatus(rt manager.RuleTrace) string {
	var parts []string
	switch {
	case rt.Error != "":
		parts = append(parts, "Error: "+rt.Error)
	case rt.Skipped:
		parts = append(parts, "Skipped: "+rt.Reason)
	default:
		parts = append(parts, strings.TrimSuffix(rt.Reason+": "+rt.Message, ": "))
	}
	if rt.Rollout != "" {
		parts = append(parts, rt.Rollout)
	}
	return strings.Join(parts, "; ")
}

func childSynced(ch manager.ChildTrace) string {
	if !ch.Exists || ch.Conflict != "" || ch.AsIs || ch.Held != "" {
		return "-"
	}
	return boolWord(ch.Synced)
}

func childStatus(ch manager.ChildTrace) string {
	var s []string
	switch {
	case ch.Unreachable != "":
		s = append(s, "Unreachable: "+ch.Unreachable)
	case ch.Held != "":
		s = append(s, "RolloutPending: "+ch.Held)
	case ch.Conflict != "":
		s = append(s, "Conflict: "+ch.Conflict)
	case !ch.Exists && ch.Patch:
		s = append(s, "Missing: the object to patch does not exist")
	case !ch.Exists:
		s = append(s, "Missing: does not exist")
	case ch.AsIs:
		s = append(s, "as it is")
	case !ch.Synced:
		s = append(s, "Drifted: "+ch.Drift)
	}
	if ch.Patch {
		s = append(s, "patched, not owned")
	}
	return strings.Join(s, "; ")
}

// whereSuffix says where a child is: its namespace, and the cluster of
// the fleet it is in ("": syncloop's own, not said).
func whereSuffix(ns, cluster string) string {
	if cluster == "" {
		return nsSuffix(ns)
	}
	if ns == "" {
		return " (in cluster " + cluster + ")"
	}
	return " (" + ns + ", in cluster " + cluster + ")"
}

func nsSuffix(ns string) string {
	if ns == "" {
		return ""
	}
	return " (" + ns + ")"
}

func boolWord(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// runTrace traces o (once, or with watch until ready) and prints it in
// output; exit 3 when not ready.
func runTrace(cmd *cobra.Command, rf *ruleFlags, cf *clusterFlags, o manager.TraceOptions, output string, watch bool, timeout time.Duration) error {
	cl, err := cf.clients()
	if err != nil {
		return err
	}
	if len(rf.paths) > 0 {
		if o.Set, err = rf.load(cmd.ErrOrStderr(), cl); err != nil {
			return err
		}
	} else {
		l, err := rf.newLoader(cl)
		if err != nil {
			return err
		}
		// A function's module is not in its revision: its rule is shown,
		// its function says it cannot run here.
		o.Revisions = l.ForInspection()
	}
	if watch {
		return watchTrace(cmd, cl, o, output, timeout)
	}
	rep, err := manager.Trace(cmd.Context(), cl, o)
	if err != nil {
		return err
	}
	if err := writeTrace(cmd.OutOrStdout(), rep, output, time.Now()); err != nil {
		return err
	}
	if !rep.Ready {
		return exitCode(3)
	}
	return nil
}
