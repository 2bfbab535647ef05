// Command robustness runs syncloop through randomized fault campaigns
// (package internal/campaign) for as long as asked, the topologies in
// turn, each campaign with a seed of its own, and prints each report: the
// seed, the faults injected by kind, the invariants checked. It exits 1
// when an invariant broke; the report's seed replays the campaign.
// `make robustness` runs it for 30 minutes; hack/testenv.sh must have
// built the control plane.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/syncloop/syncloop/internal/campaign"
)

func main() {
	total := flag.Duration("duration", 30*time.Minute, "how long to run campaigns in all")
	each := flag.Duration("campaign", 5*time.Minute, "how long each campaign injects faults")
	seed := flag.Uint64("seed", 0, "the first campaign's seed (0: from the clock); each next one adds 1")
	topologies := flag.String("topology", "single,leader,sharded", "the topologies to run, in turn")
	bin := flag.String("syncloop", "", "the syncloop binary (default: built from this checkout)")
	keep := flag.String("keep", "", "a directory to keep each campaign's logs and audit log in")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *total, *each, *seed, strings.Split(*topologies, ","), *bin, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "robustness:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, total, each time.Duration, seed uint64, topologies []string, bin, keep string) error {
	if bin == "" {
		dir, err := os.MkdirTemp("", "syncloop-robustness-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "syncloop")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/syncloop").CombinedOutput(); err != nil {
			return fmt.Errorf("building syncloop: %v\n%s", err, out)
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	}
	end := time.Now().Add(total)
	faults, campaigns, failed := 0, 0, 0
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		topology := topologies[i%len(topologies)]
		d := min(each, time.Until(end))
		cfg := campaign.Config{Seed: seed + uint64(i), Topology: topology, Duration: d, Binary: bin, Log: os.Stdout}
		if keep != "" {
			cfg.Keep = filepath.Join(keep, fmt.Sprintf("%d-%s", cfg.Seed, topology))
		}
		r, err := campaign.Run(ctx, cfg)
		if err != nil {
			return err
		}
		fmt.Print(r)
		campaigns++
		faults += r.Faults()
		if len(r.Violations) > 0 {
			failed++
		}
	}
	fmt.Printf("%d campaigns, %d faults injected in all, %d with violations\n", campaigns, faults, failed)
	if failed > 0 {
		return fmt.Errorf("%d campaigns broke an invariant", failed)
	}
	return nil
}
