package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/printable"
)

func newRolloutCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rollout",
		Short: "Inspect the revisions of the rules in force in a cluster",
	}
	cmd.AddCommand(newRolloutStatusCommand())
	return cmd
}

func newRolloutStatusCommand() *cobra.Command {
	var (
		cf           clusterFlags
		namespace    string
		installation string
		output       string
	)
	cmd := &cobra.Command{
		Use:   "status [RULE] [-n NAMESPACE] [-o text|json]",
		Short: "Print each rule's revisions, newest first, from the cluster",
		Long: `rollout status reads the revisions syncloop recorded of each rule — the
ControllerRevisions in its namespace (-n; the Leases' namespace of syncloop
run) — and prints them newest first: number, object name, content hash,
when it was recorded and the state of the rollout to it. The newest is the
version put in force last; where its rollout stands follows the table:
the step, the triggers moved, and why it halted or rolled back. Then the
storage migrations under way of the kinds the rules define (spec.api):
the storage version objects move to, and how many have moved.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output must be text or json, not %q", output)
			}
			cl, err := cf.clients()
			if err != nil {
				return err
			}
			if namespace == "" {
				namespace = cf.namespace()
			}
			rule := ""
			if len(args) == 1 {
				rule = args[0]
			}
			revs, err := manager.Revisions(cmd.Context(), cl, namespace, installation, rule)
			if err != nil {
				return err
			}
			// Storage migrations, from the CRDs: shown when they can be read.
			migrations, _ := manager.Migrations(cmd.Context(), cl, installation, rule)
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"namespace": namespace, "revisions": revs, "migrations": migrations})
			}
			if len(revs) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), printable.Text("no revisions in namespace "+namespace))
			} else if err := printRevisions(cmd.OutOrStdout(), revs); err != nil {
				return err
			}
			printMigrations(cmd.OutOrStdout(), migrations)
			return nil
		},
	}
	cf.registerKubeconfig(cmd)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "syncloop's namespace, where the revisions are (default: the kubeconfig context's)")
	cmd.Flags().StringVar(&installation, "installation", "", "the installation of syncloop whose rules to show (default: the default installation)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

// printRevisions prints revs as a table, then where the newest revisions'
// rollouts stand and what removing a rule did.
func printRevisions(out io.Writer, revs []manager.Revision) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "RULE\tREVISION\tNAME\tHASH\tRECORDED\tROLLOUT")
	var rollouts []string
	for _, r := range revs {
		num := fmt.Sprint(r.Revision)
		if r.Newest {
			num += " (newest)"
		}
		hash := r.Hash
		if len(hash) > 12 {
			hash = hash[:12]
		}
		state := "-"
		if ro := r.Rollout; ro != nil {
			state = ro.State
			if r.Newest {
				rollouts = append(rollouts, r.RolloutSummary())
			}
		}
		if r.Removal != nil {
			state = "Removed"
			rollouts = append(rollouts, r.RemovalSummary())
		}
		// Names, hashes and states are the revisions' labels and
		// annotations: each cell printable, so it stays in its column.
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s ago\t%s\n", printable.Text(r.Rule), num, printable.Text(r.Name), printable.Text(hash),
			time.Since(r.Created).Round(time.Second), printable.Text(state))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, line := range rollouts {
		fmt.Fprintln(out, line)
	}
	return nil
}

// printMigrations prints a line per storage migration: the CRD's names
// and versions, made printable.
func printMigrations(out io.Writer, migrations []manager.Migration) {
	for _, m := range migrations {
		fmt.Fprintln(out, printable.Text(fmt.Sprintf("storage migration %s (rule %s): to %s, %d objects rewritten; objects may be stored in %s",
			m.CRD, m.Rule, m.To, m.Rewritten, strings.Join(m.Stored, ", "))))
	}
}
