package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/rules"
)

func newSchemaCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "schema",
		Short: "Print the JSON Schema of Rule and Test documents, for editors",
		Long: `schema prints the JSON Schema (draft 2020-12) of syncloop.dev/v1alpha1 Rule and
Test documents: every field with its description, unknown fields rejected as
syncloop rejects them. It is generated from the same description of the format
the decoder takes its fields from; docs/syncloop.schema.json is a copy. Point a
YAML language server at it (see docs/rules.md, "Editor support").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := rules.JSONSchema()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", s)
			return nil
		},
	}
}
