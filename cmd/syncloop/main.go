// Command syncloop is the syncloop controller and its offline tools. This
// package holds flags, logging and signals only; what the commands do lives
// in the engine, rules and dynamic packages.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "syncloop",
		Short: "A Kubernetes controller whose behaviour is written as YAML rules",
		Long: `syncloop watches the objects its rules name and keeps the children each rule
describes in sync with them: rendered from CEL templates, server-side applied,
pruned when no longer desired, with status written back.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand())
	return root
}
