// Command syncloop is the syncloop controller and its offline tools. This
// package holds flags, logging and signals only: what the commands do lives
// in internal/manager (a running syncloop, plan, trace), rules/offline
// (render, test), rules (validate, schema), rules/diagram (graph), the
// engine and dynamic; it owns none of it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/internal/printable"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext is run under ctx: cancelling it stops `syncloop run` as a
// signal would.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	var ec exitCode
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ec):
		return int(ec) // the command has reported what went wrong
	default:
		// An error quotes names and messages of the cluster and files.
		fmt.Fprintln(root.ErrOrStderr(), printable.Block("Error: "+err.Error(), "  "))
		return 1
	}
}

// commandName is how syncloop is called: "kubectl syncloop" when it runs
// as kubectl's plugin (installed as kubectl-syncloop).
func commandName(arg0 string) string {
	if strings.HasPrefix(filepath.Base(arg0), "kubectl-syncloop") {
		return "kubectl syncloop"
	}
	return "syncloop"
}

// exitCode is returned by a command that has already printed its errors
// and wants the process to exit with this code.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use: "syncloop",
		// As kubectl's plugin, help shows the commands as they are typed.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: commandName(os.Args[0])},
		Short:       "A Kubernetes controller whose behaviour is written as YAML rules",
		Long: `syncloop watches the objects its rules name and keeps the children each rule
describes in sync with them: rendered from CEL templates, server-side applied,
pruned when no longer desired, with status written back.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand(), newValidateCommand(), newRenderCommand(), newTestCommand(), newSchemaCommand(), newCRDsCommand(), newRunCommand(), newPlanCommand(), newRolloutCommand(), newFinalizersCommand(), newGraphCommand(), newTraceCommand())
	// klog's verbosity flags for every command; logs go to stderr.
	logFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(logFlags)
	for _, name := range []string{"v", "vmodule"} {
		root.PersistentFlags().AddGoFlag(logFlags.Lookup(name))
	}
	return root
}
