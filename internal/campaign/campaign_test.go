//go:build robustness

package campaign

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/syncloop/syncloop/internal/testenv"
)

// buildSyncloop builds the syncloop of this checkout for the campaign.
func buildSyncloop(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "syncloop")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/syncloop").CombinedOutput(); err != nil {
		t.Fatalf("building syncloop: %v\n%s", err, out)
	}
	return bin
}

// seed is the campaign's seed: $CAMPAIGN_SEED to replay one, else fixed,
// so that the suite's runs are the same campaign every time.
// $CAMPAIGN_KEEP keeps each campaign's logs and audit log there.
func seed(t *testing.T, fixed uint64) uint64 {
	if s := os.Getenv("CAMPAIGN_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CAMPAIGN_SEED: %v", err)
		}
		return v
	}
	return fixed
}

// TestCampaign is the short seeded campaign of every test run: each
// topology for 25 s of faults (make robustness runs them for 30 minutes
// with new seeds). Every invariant must hold, and faults must have been
// injected of every kind the campaign knows (it owes, at half time, the
// kinds it has not drawn yet).
func TestCampaign(t *testing.T) {
	if testing.Short() {
		t.Skip("starts control planes and syncloop processes")
	}
	if _, err := os.Stat(filepath.Join(testenv.CacheDir(), "kube-apiserver")); err != nil && os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatalf("no control plane binaries: run hack/testenv.sh (make testenv): %v", err)
	}
	bin := buildSyncloop(t)
	for i, topology := range []string{Single, Leader, Sharded} {
		t.Run(topology, func(t *testing.T) {
			cfg := Config{Seed: seed(t, uint64(48+i)), Topology: topology, Duration: 25 * time.Second,
				Binary: bin, ProcessFaultEvery: 6 * time.Second, Log: testWriter{t}}
			if keep := os.Getenv("CAMPAIGN_KEEP"); keep != "" { // the logs and the audit log, for a failure
				cfg.Keep = filepath.Join(keep, topology)
			}
			r, err := Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + r.String())
			for _, v := range r.Violations {
				t.Error(v)
			}
			for _, kind := range []string{"reset-before", "server-error", "too-many-requests", "latency", "watch-cut"} {
				if r.Injected[kind] == 0 {
					t.Errorf("no %s fault was injected", kind)
				}
			}
			if r.Injected["sigkill"]+r.Injected["apiserver-restart"] == 0 {
				t.Error("no process fault was injected")
			}
		})
	}
}

// testWriter sends the campaign's progress to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
