package main

import (
	"cmp"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/printable"
)

func newPlanCommand() *cobra.Command {
	var (
		rf                ruleFlags
		cf                clusterFlags
		output            string
		syncloopNamespace string
	)
	cmd := &cobra.Command{
		Use:   "plan -f PATH... [-o text|json]",
		Short: "Print what syncloop would do to the cluster now, and exit: 0 nothing to do, 2 changes pending, 1 error",
		Long: `plan reads every rule's triggers and children once, computes each write with a
server-side dry-run request (so defaulting and admission show; nothing is
persisted), prints the actions and a summary, and exits 0 when there is
nothing to do, 2 when changes are pending and 1 on any error. A rule that
differs from its newest revision recorded in --syncloop-namespace is
planned as its rollout goes: the actions of its first step (or of the step
a rollout under way has reached), with a line saying how many steps follow
or why it would halt.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output must be text or json, not %q", output)
			}
			cl, err := cf.clients()
			if err != nil {
				return err
			}
			// The cluster's schemas: custom kinds are typed as installed;
			// the kinds rules define are checked against their CRDs.
			rf.served, rf.manageCRDs = manager.CRDSource(cl, cf.manageCRDs), cf.manageCRDs
			rf.home = cmp.Or(syncloopNamespace, cf.namespace())
			set, err := rf.load(cmd.ErrOrStderr(), cl)
			if err != nil {
				return err
			}
			o := manager.PlanOptions{
				Namespace: cf.watchNamespace, JSON: output == "json", Stdout: cmd.OutOrStdout(), Stderr: cmd.ErrOrStderr(),
				NoManageCRDs: !cf.manageCRDs,
				Revisions:    rf.loader.ForRevisions(), SyncloopNamespace: rf.home, Installation: rf.installation,
				Clusters: manager.Clusters{Namespace: cmp.Or(cf.clusters.Namespace, rf.home), Trust: cf.clusters.Trust, RequestTimeout: cf.clusters.RequestTimeout},
			}
			// On a terminal, a line on stderr says how far the plan is.
			status := &statusLine{w: cmd.ErrOrStderr(), width: terminalWidth(cmd.ErrOrStderr())}
			if status.width > 0 {
				o.Progress = func(planned, queued int64) { status.set(planProgress(set.Len(), planned, queued)) }
			}
			actions, failures, err := manager.Plan(cmd.Context(), cl, set, o)
			status.clear()
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), printable.Block("error: "+err.Error(), "  "))
				return exitCode(1)
			}
			switch {
			case failures > 0:
				return exitCode(1)
			case actions > 0:
				return exitCode(2)
			}
			return nil
		},
	}
	rf.register(cmd)
	rf.webhook.register(cmd)
	rf.registerInstallation(cmd)
	rf.registerIdentity(cmd)
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "plan format: text or json (one object per line)")
	cmd.Flags().StringVar(&syncloopNamespace, "syncloop-namespace", "", "syncloop's namespace (run's --leader-elect-namespace), where the rules' revisions are: a changed rule is planned as its rollout goes, step by step (default: the kubeconfig context's)")
	return cmd
}

// planProgress is plan's status line.
func planProgress(rules int, planned, queued int64) string {
	noun := "rules"
	if rules == 1 {
		noun = "rule"
	}
	return fmt.Sprintf("planning %d %s: %d reconciles planned, %d queued…", rules, noun, planned, queued)
}
