package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/printable"
)

func newFinalizersCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "finalizers",
		Short: "Find or take off the teardown finalizers syncloop puts on triggers",
		Long: `A rule that orders its teardown (spec.teardown: Ordered, the default with
spec.api) holds each trigger with a finalizer, teardown.syncloop.dev/<rule>,
while it has children, and takes it off once they are torn down. syncloop
takes it off itself when the rule is removed or stops ordering; these
commands are for a syncloop that is gone: uninstalled (the chart's
post-delete hook runs finalizers remove), or stopped for good.`,
	}
	cmd.AddCommand(newFinalizersListCommand(), newFinalizersRemoveCommand())
	return cmd
}

// heldFlags are the flags of the finalizers commands.
type heldFlags struct {
	cf   clusterFlags
	opts manager.HeldOptions
}

func (f *heldFlags) register(cmd *cobra.Command) {
	f.cf.registerKubeconfig(cmd)
	cmd.Flags().StringVar(&f.opts.Installation, "installation", "", "the installation of syncloop whose finalizers these are (default: the default installation)")
	cmd.Flags().StringVarP(&f.opts.Namespace, "namespace", "n", "", "look only at the namespaced kinds of this namespace (run's --watch-namespace; default: every kind, everywhere)")
}

func newFinalizersListCommand() *cobra.Command {
	var (
		f      heldFlags
		output string
	)
	cmd := &cobra.Command{
		Use:   "list [-o text|json]",
		Short: "Print every object that holds a teardown finalizer of syncloop",
		Long: `list reads the metadata of every object of every kind the cluster serves that
can be listed and patched, and prints those holding a teardown finalizer of
the installation, and whether each is being deleted (waiting for it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output must be text or json, not %q", output)
			}
			cl, err := f.cf.clients()
			if err != nil {
				return err
			}
			held, unlisted, err := manager.HeldObjects(cmd.Context(), cl, f.opts)
			if err != nil {
				return err
			}
			sayUnlisted(cmd, unlisted)
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"held": held})
			}
			return printHeld(cmd.OutOrStdout(), held)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func newFinalizersRemoveCommand() *cobra.Command {
	var (
		f       heldFlags
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "remove [--dry-run]",
		Short: "Take syncloop's teardown finalizers off every object that holds one",
		Long: `remove takes the installation's teardown finalizers off every object that
holds one (as list finds them), so that no trigger waits for a syncloop that
is gone: a trigger being deleted then goes at once, its children with it
(the garbage collector deletes them all together, as without an ordered
teardown). Each removal tests the object's UID and the finalizer's place
first, so nothing else is touched. While a pass removes some, another
follows after 5s — a syncloop still stopping may put one back — until
--timeout. Run it once syncloop is gone: a running syncloop holds its
triggers again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := f.cf.clients()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			verb := "removed"
			if f.opts.DryRun {
				verb = "would remove"
			}
			n, unlisted, err := manager.ReleaseHeld(ctx, cl, f.opts, func(h manager.Held) {
				fmt.Fprintln(cmd.OutOrStdout(), printable.Text(fmt.Sprintf("%s %s from %s %s", verb, strings.Join(h.Finalizers, ","), h.Resource.GroupResource(), h.Object())))
			})
			sayUnlisted(cmd, unlisted)
			fmt.Fprintf(cmd.OutOrStdout(), "%d objects released\n", n)
			return err
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&f.opts.DryRun, "dry-run", false, "print what would be removed (server-side dry runs), change nothing")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to keep removing finalizers put back")
	return cmd
}

// sayUnlisted tells which resources could not be listed: an object of
// those may still hold a finalizer.
func sayUnlisted(cmd *cobra.Command, unlisted []string) {
	if len(unlisted) > 0 {
		fmt.Fprintln(cmd.ErrOrStderr(), printable.Text("not allowed to list (skipped): "+strings.Join(unlisted, ", ")))
	}
}

// printHeld prints the objects held as a table; the cluster's kinds,
// names and finalizers are made printable, each in its column.
func printHeld(out io.Writer, held []manager.Held) error {
	if len(held) == 0 {
		fmt.Fprintln(out, "no object holds a teardown finalizer of syncloop")
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "RESOURCE\tOBJECT\tFINALIZERS\tDELETING")
	for _, h := range held {
		fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", printable.Text(h.Resource.GroupResource().String()), printable.Text(h.Object()),
			printable.Text(strings.Join(h.Finalizers, ",")), h.Deleting)
	}
	return w.Flush()
}
