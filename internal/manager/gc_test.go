package manager

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestGCPercent: run sets the collector's target to GCPercent, unless
// the operator set GOGC.
func TestGCPercent(t *testing.T) {
	orig := debug.SetGCPercent(100)
	defer debug.SetGCPercent(orig)
	if v, set := os.LookupEnv("GOGC"); set {
		defer os.Setenv("GOGC", v)
	} else {
		defer os.Unsetenv("GOGC")
	}

	os.Unsetenv("GOGC")
	setGCPercent()
	if got := debug.SetGCPercent(100); got != GCPercent {
		t.Errorf("without GOGC the target is %d, want %d", got, GCPercent)
	}
	os.Setenv("GOGC", "200")
	setGCPercent()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("with GOGC set, run changed the target to %d", got)
	}
}
