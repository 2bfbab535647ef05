package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/offline"
)

func newRenderCommand() *cobra.Command {
	var (
		rf      ruleFlags
		objects []string
		output  string
		only    string
	)
	cmd := &cobra.Command{
		Use:   "render -f PATH... --objects PATH... [-o yaml|json] [--rule NAME]",
		Short: "Render rules against objects from files, without a cluster",
		Long: `render evaluates every rule against every object in the --objects files that
its watch matches (apiVersion, kind, namespace, label selector; field selectors
on metadata.name and metadata.namespace — others are reported and ignored) and
prints the children and status syncloop would apply. A kind's scope comes from
client-go's built-in kinds, from CustomResourceDefinitions among the objects,
or from the objects themselves. Exit status 1 if any rendering fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "yaml" && output != "json" {
				return fmt.Errorf("--output must be yaml or json, not %q", output)
			}
			objs, err := rules.ReadObjects(objects...)
			if err != nil {
				return err
			}
			// CRDs among the objects type the templates of their kinds.
			set, err := rf.load(cmd.ErrOrStderr(), nil, objs...)
			if err != nil {
				return err
			}
			res, err := offline.Render(cmd.Context(), set, objs, only)
			if err != nil {
				return err
			}
			for _, r := range set.Rules() {
				if ne := res.NotEvaluated[r.Name]; len(ne) > 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "rule %q: field selector %s not evaluated offline: objects matched without it\n",
						r.Name, strings.Join(ne, ","))
				}
			}
			if output == "json" {
				err = res.WriteJSON(cmd.OutOrStdout())
			} else {
				err = res.WriteYAML(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if res.Failed() {
				for _, r := range res.Results {
					if r.Error != "" {
						fmt.Fprintln(cmd.ErrOrStderr(), r.Error)
					}
				}
				return exitCode(1)
			}
			return nil
		},
	}
	rf.register(cmd)
	rf.registerTenant(cmd)
	rf.registerInstallation(cmd)
	cmd.Flags().StringArrayVar(&objects, "objects", nil, "file or directory of Kubernetes objects (YAML or JSON; repeatable)")
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml or json")
	cmd.Flags().StringVar(&only, "rule", "", "render only this rule")
	_ = cmd.MarkFlagRequired("objects")
	return cmd
}
