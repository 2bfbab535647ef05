package manager

import (
	"bytes"
	"strings"
	"testing"

	"github.com/syncloop/syncloop/engine/rollout"
)

// TestRolloutLines: a plan and /readyz say which clusters a rollout by
// cluster has reached, and how many steps follow; a rollout by trigger
// counts its triggers as before.
func TestRolloutLines(t *testing.T) {
	byCluster := rollout.Status{Rule: "staged", ByCluster: true, Reached: []string{"canary"},
		Record: rollout.Record{State: rollout.Progressing, Step: 1, Steps: 3, To: "0e5d30407bffff", From: "aaaaaaaaaaaa", Moved: 4, Total: 4}, OnTo: 4}
	var out bytes.Buffer
	printRollout(PlanOptions{Stdout: &out}, byCluster)
	if want := "Rollout of rule staged to revision 0e5d30407b by cluster: step 1 of 3, every trigger on it in syncloop's own cluster and cluster canary (planned below); 2 steps follow, each once the clusters before are healthy.\n"; out.String() != want {
		t.Errorf("plan line:\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	printRollout(PlanOptions{Stdout: &out, JSON: true}, byCluster)
	if !strings.Contains(out.String(), `"clusters":["canary"]`) {
		t.Errorf("plan JSON %s: want the clusters reached", out.String())
	}
	if got := rolloutLine(byCluster); !strings.Contains(got, "step 1 of 3, 4 triggers on revision 0e5d30407b") || !strings.Contains(got, "by cluster: reached syncloop's own cluster and cluster canary") ||
		strings.Contains(got, "healthy") {
		t.Errorf("/readyz line %q: a replica that does not step the rollout judges no health", got)
	}
	judged := byCluster
	judged.Healthy, judged.Judging = 3, 4
	if got := rolloutLine(judged); !strings.Contains(got, "0e5d30407b, 0 on aaaaaaaaaa, 3 of the step's 4 healthy, by cluster") {
		t.Errorf("/readyz line of the replica that steps the rollout %q: want how many of the step are healthy", got)
	}
	byTrigger := byCluster
	byTrigger.ByCluster, byTrigger.Reached = false, nil
	out.Reset()
	printRollout(PlanOptions{Stdout: &out}, byTrigger)
	if !strings.Contains(out.String(), ": step 1 of 3, 4 of 4 triggers on it (planned below); 2 steps follow, each once the one before is healthy.") {
		t.Errorf("plan line by trigger: %s", out.String())
	}
}
