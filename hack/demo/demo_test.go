package main

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDemo runs what `make demo` runs, so the README's first command keeps
// working: a freshly built syncloop reconciles every example, its Apps
// become Ready (trace exits 0), a change of the app rule rolls out step
// by step to completion, it follows a change of a trigger, prunes after
// a delete and exits cleanly on SIGTERM.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: starts the local control plane")
	}
	bin := filepath.Join(t.TempDir(), "syncloop")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/syncloop").CombinedOutput(); err != nil {
		t.Fatalf("building syncloop: %v\n%s", err, out)
	}
	if err := demo(t.Context(), bin, "../../examples"); err != nil {
		t.Fatal(err)
	}
}
