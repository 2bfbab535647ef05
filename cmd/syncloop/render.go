package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/offline"
	"github.com/syncloop/syncloop/rules/render"
)

func newRenderCommand() *cobra.Command {
	var (
		rf        ruleFlags
		objects   []string
		responses []string
		output    string
		only      string
	)
	cmd := &cobra.Command{
		Use:   "render -f PATH... --objects PATH... [-o yaml|json] [--rule NAME]",
		Short: "Render rules against objects from files, without a cluster",
		Long: `render evaluates every rule against every object in the --objects files that
its watch matches (apiVersion, kind, namespace, label selector; field selectors
on metadata.name and metadata.namespace — others are reported and ignored) and
prints the children and status syncloop would apply. A kind's scope comes from
client-go's built-in kinds, from CustomResourceDefinitions among the objects,
or from the objects themselves. A webhook is not called: --responses names
files of kind: Test documents whose responses answer for it. Exit status 1 if
any rendering fails.`,
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
			recorded, err := readResponses(responses, rf.tenant)
			if err != nil {
				return err
			}
			res, err := offline.Render(cmd.Context(), set, objs, only, recorded...)
			if err != nil {
				return err
			}
			for _, r := range set.Rules() {
				if ne := res.NotEvaluated[r.Name]; len(ne) > 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), printable.Text(fmt.Sprintf("rule %q: field selector %s not evaluated offline: objects matched without it",
						r.Name, strings.Join(ne, ","))))
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
						fmt.Fprintln(cmd.ErrOrStderr(), printable.Block(r.Error, "  "))
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
	cmd.Flags().StringArrayVar(&responses, "responses", nil, "file of kind: Test documents whose responses answer the rules' webhooks (repeatable)")
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml or json")
	cmd.Flags().StringVar(&only, "rule", "", "render only this rule")
	_ = cmd.MarkFlagRequired("objects")
	return cmd
}

// readResponses reads the webhook responses the Test documents of files
// record.
func readResponses(files []string, tenant string) ([]render.RecordedResponse, error) {
	var out []render.RecordedResponse
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		tests, err := rules.ParseTests(file, data)
		if err != nil {
			return nil, err
		}
		for _, t := range tests {
			rs, err := offline.Responses(t, tenant)
			if err != nil {
				return nil, err
			}
			out = append(out, rs...)
		}
	}
	return out, nil
}
