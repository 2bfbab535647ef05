package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/printable"
)

func newCRDsCommand() *cobra.Command {
	var rf ruleFlags
	cmd := &cobra.Command{
		Use:   "crds -f PATH...",
		Short: "Print the CustomResourceDefinitions of the kinds the rules define (spec.api), as YAML",
		Long: `crds loads the rules as validate does and prints, as a YAML stream, the
CustomResourceDefinition of every kind a rule defines with spec.api, exactly as
syncloop run applies it: for review, and for installations whose CRDs come from
GitOps (run --manage-crds=false). Rules that define no kind print nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			set, err := rf.load(cmd.ErrOrStderr(), nil)
			if err != nil {
				return err
			}
			first := true
			for _, r := range set.Rules() {
				crd := r.CRD()
				if crd == nil {
					continue
				}
				data, err := printable.YAML(crd.Object)
				if err != nil {
					return err
				}
				if !first {
					fmt.Fprintln(cmd.OutOrStdout(), "---")
				}
				first = false
				// The comment's file name is the user's: one line, whatever it holds.
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n%s", printable.Text(fmt.Sprintf("# The kind rule %s defines (%s)", r.Name, r.API.Pos)), data)
			}
			return nil
		},
	}
	rf.register(cmd)
	rf.webhook.register(cmd)
	return cmd
}
