package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
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
			for _, r := range set.Rules() {
				if r.API != nil && r.API.Converts() {
					fmt.Fprintln(cmd.OutOrStdout(), printable.Text(fmt.Sprintf("rule %s: %s", r.Name, versionsLine(r.API))))
				}
			}
			return nil
		},
	}
	rf.register(cmd)
	rf.registerTenant(cmd)
	return cmd
}

// versionsLine says which versions a kind has and what each is for.
func versionsLine(a *rules.API) string {
	var vs []string
	for _, v := range a.Versions {
		var roles []string
		for _, role := range []struct {
			on   bool
			name string
		}{{v.Storage, "stored"}, {v == a.Hub(), "hub"}, {v == a.Version, "read by the rule"}, {!v.Served, "not served"}, {v.Deprecated, "deprecated"}} {
			if role.on {
				roles = append(roles, role.name)
			}
		}
		if len(roles) > 0 {
			vs = append(vs, v.Name+" ("+strings.Join(roles, ", ")+")")
		} else {
			vs = append(vs, v.Name)
		}
	}
	return fmt.Sprintf("%s (%s) in versions %s, converted by syncloop's webhook (syncloop crds prints the CRD)", a.Kind, a.CRDName(), strings.Join(vs, ", "))
}
