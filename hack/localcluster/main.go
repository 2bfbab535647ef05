// Command localcluster runs the local control plane of internal/testenv in
// the foreground — etcd, kube-apiserver and kube-controller-manager on
// loopback — prints the kubeconfig that reaches it, and stops everything on
// Ctrl-C or SIGTERM. It is what `make demo` starts; hack/testenv.sh must have
// built the binaries.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

func main() {
	dir := flag.String("dir", "", "scratch directory for etcd data, PKI and logs (default: a new temporary directory, removed on exit)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	env, err := testenv.Start(ctx, testenv.Options{ControllerManager: true, Dir: *dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
	fmt.Printf("Local control plane %s ready in %v.\n", testenv.KubeVersion, time.Since(start).Round(100*time.Millisecond))
	fmt.Printf("  kubeconfig: %s\n", env.Kubeconfig())
	fmt.Printf("  logs:       %s/*.log\n", env.Dir())
	fmt.Printf("Use it with:  export KUBECONFIG=%s\n", env.Kubeconfig())
	if *dir == "" {
		fmt.Println("Stop it with Ctrl-C (or SIGTERM to this process); its scratch directory is removed.")
	} else {
		fmt.Println("Stop it with Ctrl-C (or SIGTERM to this process); " + *dir + " is kept.")
	}

	<-ctx.Done()
	env.Stop()
	fmt.Println("Local control plane stopped.")
}
