package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/offline"
)

func newTestCommand() *cobra.Command {
	var (
		costLimit uint64
		tenant    string
	)
	cmd := &cobra.Command{
		Use:   "test PATH...",
		Short: "Run the Test documents in files or directories, without a cluster: exit 0 all pass, 1 a test fails, 2 a file error",
		Long: `test finds the kind: Test documents in the files and directories given
(directories are walked for *.yaml and *.yml), loads each test's rules and
objects, renders the rules against the objects as render does — the objects
stand for the cluster: triggers, lookup targets, CRDs and live children — and
checks the test's expectations: children rendered (partial objects, matched as
subsets), children absent, a partial status, skipped, an error. It prints
PASS or FAIL <file>: <test> per test and, under a failure, each field that
differs with both values (Secret data as hashes). Exit 0 when every test
passes, 1 when one fails, 2 when a file does not load.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
			files, err := rules.FindFiles(args...)
			if err != nil {
				printLoadError(errOut, err)
				return exitCode(2)
			}
			var n testTally
			for _, path := range files {
				n.runFile(cmd.Context(), out, errOut, path, expr.Options{CostLimit: costLimit}, tenant)
			}
			fileErrors, failed, passed, ran := n.fileErrors, n.failed, n.passed, n.ran
			if ran == 0 && fileErrors == 0 {
				fmt.Fprintln(errOut, "no Test documents found")
				return exitCode(2)
			}
			fmt.Fprintf(out, "%d test(s): %d passed, %d failed", ran, passed, failed)
			if fileErrors > 0 {
				fmt.Fprintf(out, ", %d file error(s)", fileErrors)
			}
			fmt.Fprintln(out)
			switch {
			case fileErrors > 0:
				return exitCode(2)
			case failed > 0:
				return exitCode(1)
			}
			return nil
		},
	}
	cmd.Flags().Uint64Var(&costLimit, "cel-cost-limit", expr.DefaultCostLimit, "CEL cost limit of one expression evaluation")
	cmd.Flags().StringVar(&tenant, "tenant", "", "run the tests' rules as the tenant rules of this namespace (see validate --tenant); expectations name the rules as their files do")
	return cmd
}

// testTally counts the tests run, and how they went.
type testTally struct{ fileErrors, failed, passed, ran int }

// runFile runs the Test documents of the file at path, printing PASS or
// FAIL per test, and counts them.
func (n *testTally) runFile(ctx context.Context, out, errOut io.Writer, path string, opts expr.Options, tenant string) {
	data, err := os.ReadFile(path)
	if err != nil {
		printLoadError(errOut, err)
		n.fileErrors++
		return
	}
	tests, err := rules.ParseTests(path, data)
	if err != nil {
		printLoadError(errOut, err)
		n.fileErrors++
		return
	}
	// The file's name, the tests' names and the values a failure shows
	// are the file's: made printable, a failure's lines indented under
	// its test, so that no value passes for a PASS or a FAIL.
	for _, t := range tests {
		n.ran++
		failures, err := offline.RunTest(ctx, opts, t, tenant)
		switch {
		case err != nil:
			fmt.Fprintln(out, printable.Text(fmt.Sprintf("FAIL %s: %s", path, t.Name)))
			fmt.Fprintln(out, printable.Text(fmt.Sprintf("    %s: the test's files do not load:", t.Pos)))
			printLoadError(indent{out}, err)
			n.fileErrors++
		case len(failures) > 0:
			fmt.Fprintln(out, printable.Text(fmt.Sprintf("FAIL %s: %s", path, t.Name)))
			for _, f := range failures {
				fmt.Fprintf(out, "    %s\n", printable.Block(f, "      "))
			}
			n.failed++
		default:
			fmt.Fprintln(out, printable.Text(fmt.Sprintf("PASS %s: %s", path, t.Name)))
			n.passed++
		}
	}
}

// indent writes each line it is given indented by eight spaces.
type indent struct{ w io.Writer }

func (i indent) Write(p []byte) (int, error) {
	_, err := fmt.Fprintf(i.w, "        %s", p)
	return len(p), err
}
