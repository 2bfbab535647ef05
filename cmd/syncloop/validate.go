package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func newValidateCommand() *cobra.Command {
	var rf ruleFlags
	cmd := &cobra.Command{
		Use:   "validate -f PATH...",
		Short: "Check rule files without a cluster: exit 0 when valid, 1 with every error otherwise",
		Long: `validate loads the rules as syncloop run would — strict decoding, validation,
every CEL expression and template compiled — and prints every error with its
file:line:col, rule and field. Documents that are not rules (sample objects,
CustomResourceDefinitions) are skipped.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			set, err := rf.load(cmd.ErrOrStderr(), nil)
			if err != nil {
				return err
			}
			skipped := 0
			for _, f := range set.Files() {
				skipped += f.Skipped
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d rule(s) in %d file(s) valid", set.Len(), len(set.Files()))
			if skipped > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), " (%d non-rule document(s) skipped)", skipped)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
	rf.register(cmd)
	rf.registerTenant(cmd)
	return cmd
}
