package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// copyExamples copies the examples into dir, so that the demo may change
// a rule while syncloop runs from the copy. An example whose rule calls a
// webhook is left out: its hook server is not running here (its test,
// TestHelloHook, runs it).
func copyExamples(from, dir string) error {
	return filepath.WalkDir(from, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if d.IsDir() && rel != "." {
			if rule, err := os.ReadFile(filepath.Join(path, "rules.yaml")); err == nil && strings.Contains(string(rule), "webhook:") {
				return filepath.SkipDir
			}
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), data, 0o644)
	})
}

// showTrace prints `syncloop trace` of the App shop/web: every resource
// ready, exit 0.
func showTrace(ctx context.Context, bin, kubeconfig string) error {
	step("syncloop trace app web -n shop: what syncloop made of the App, read from the cluster")
	out, err := exec.CommandContext(ctx, bin, "trace", "app", "web", "-n", "shop", "--kubeconfig", kubeconfig).CombinedOutput()
	fmt.Print(indent(string(out)))
	if err != nil {
		return fmt.Errorf("syncloop trace app web: %v (exit 0 when every resource is ready)", err)
	}
	return nil
}

// showGraph prints the app rule's graph, as Mermaid.
func showGraph(ctx context.Context, bin, examples string) error {
	step("syncloop graph -f examples/app/rules.yaml: the rule's resources and what reads what (Mermaid)")
	out, err := exec.CommandContext(ctx, bin, "graph", "-f", filepath.Join(examples, "app", "rules.yaml")).CombinedOutput()
	fmt.Print(indent(string(out)))
	return err
}

// rollOut changes the app rule in the running copy of the examples — the
// Deployments' Pods get an environment variable — and follows the rollout:
// a quarter of the Apps at a time (with two Apps, one by one), each step
// once its Deployments are available again (kwok's Pods become Ready).
func rollOut(ctx context.Context, bin, kubeconfig, examples, logPath string) error {
	step("Changing the app rule: its rollout goes App by App, each step gated by the Deployments' readiness")
	file := filepath.Join(examples, "app", "rules.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	anchor := "                  image: ${object.spec.image}\n"
	if !strings.Contains(string(data), anchor) {
		return fmt.Errorf("%s no longer has the container image line the demo changes", file)
	}
	changed := strings.Replace(string(data), anchor, anchor+"                  env:\n                    - {name: DEMO_REVISION, value: \"2\"}\n", 1)
	if err := os.WriteFile(file+".tmp", []byte(changed), 0o644); err != nil {
		return err
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		return err
	}
	start := time.Now()
	last := ""
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		out, _ := exec.CommandContext(ctx, bin, "rollout", "status", "app", "-n", "default", "--kubeconfig", kubeconfig).Output()
		line := ""
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "rollout of app to revision 2") {
				line, _, _ = strings.Cut(l, ", started ")
			}
		}
		if line != "" && line != last {
			fmt.Printf("   %5.1fs  %s\n", time.Since(start).Seconds(), line)
			last = line
		}
		return strings.Contains(line, ": Complete:"), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the rollout of app to complete (last: %q): %w", last, err)
	}
	// The steps as syncloop logged them: each began once the Apps of the
	// one before were Ready again (their Deployments rolled).
	fmt.Println("   its steps, from syncloop's log:")
	log, _ := os.ReadFile(logPath)
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, `"Rollout step" rule="app"`) || strings.Contains(l, `"Rollout complete" rule="app"`) {
			if _, msg, ok := strings.Cut(l, "] "); ok {
				fields := strings.Fields(l)
				fmt.Printf("   | %s %s\n", fields[1], msg)
			}
		}
	}
	return nil
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "   " + strings.Join(lines, "\n   ") + "\n"
}
