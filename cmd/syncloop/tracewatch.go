package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/printable"
)

// traceInterval is how often trace --watch traces again: a handful of
// reads (the trigger, its children by label, lookups, Events) a second.
const traceInterval = time.Second

// watchTrace traces o every traceInterval, showing each report, until every
// resource is ready (nil) or timeout (if not 0) passes or the command is
// interrupted (exit 3). An error reading the cluster ends it (exit 1).
func watchTrace(cmd *cobra.Command, cl *manager.Clients, o manager.TraceOptions, output string, timeout time.Duration) error {
	ctx := cmd.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	out := cmd.OutOrStdout()
	scr := &screen{w: out, width: terminalWidth(out)}
	for {
		rep, err := manager.Trace(ctx, cl, o)
		if ctx.Err() != nil {
			return exitCode(3)
		}
		if err != nil {
			return err
		}
		var text bytes.Buffer
		now := time.Now()
		if scr.width > 0 {
			fmt.Fprintf(&text, "%s\n\n", watchHeading(rep, now))
		}
		if err := writeTrace(&text, rep, output, now); err != nil {
			return err
		}
		key, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		scr.show(text.String(), string(key))
		if rep.Ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return exitCode(3)
		case <-time.After(traceInterval):
		}
	}
}

// watchHeading is the line above each report trace --watch draws on a
// terminal; the trigger's names are the cluster's, made printable.
func watchHeading(rep *manager.TraceReport, now time.Time) string {
	return fmt.Sprintf("Every %s, until ready: %s, at %s", traceInterval,
		printable.Text(rep.Trigger.Kind+"/"+rep.Trigger.Name+nsSuffix(rep.Trigger.Namespace)), now.Format(time.TimeOnly))
}
