package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/rules/diagram"
)

func newGraphCommand() *cobra.Command {
	var (
		rf     ruleFlags
		output string
		only   string
	)
	cmd := &cobra.Command{
		Use:   "graph -f PATH... [--rule NAME] [-o mermaid|dot]",
		Short: "Draw rules' resources, lookups and references, without a cluster",
		Long: `graph loads the rules as validate does and draws each as a graph: the
trigger, the lookups, the resources and the status, linked by the references
their compiled expressions make (children.<id> and lookups.<id>, through
variables too). A thick edge waits: a resource that reads another's children
is applied once they exist and are ready, one that reads a required lookup
once it is found. A forEach resource is drawn as a stacked box, a resource
with a when with a dashed border, a patch as a hexagon, a required lookup
with a thick border; when, forEach and readyWhen are written on the node.

Mermaid (the default) renders in GitHub's Markdown; dot is Graphviz's
(dot -Tsvg).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			write := map[string]func(w io.Writer, g []*diagram.Graph) error{"mermaid": diagram.Mermaid, "dot": diagram.Dot}[output]
			if write == nil {
				return fmt.Errorf("--output must be mermaid or dot, not %q", output)
			}
			set, err := rf.load(cmd.ErrOrStderr(), nil)
			if err != nil {
				return err
			}
			var graphs []*diagram.Graph
			for i, r := range set.Rules() {
				if only != "" && r.Name != only {
					continue
				}
				prefix := ""
				if only == "" && set.Len() > 1 {
					prefix = fmt.Sprintf("r%d_", i)
				}
				graphs = append(graphs, diagram.Of(r, prefix))
			}
			if len(graphs) == 0 {
				if only != "" {
					return fmt.Errorf("no rule %q in %v", only, rf.paths)
				}
				return fmt.Errorf("no rules in %v", rf.paths)
			}
			return write(cmd.OutOrStdout(), graphs)
		},
	}
	rf.register(cmd)
	rf.registerTenant(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "mermaid", "output format: mermaid or dot")
	cmd.Flags().StringVar(&only, "rule", "", "draw only this rule")
	return cmd
}
