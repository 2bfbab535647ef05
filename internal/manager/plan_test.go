package manager

import (
	"bytes"
	"encoding/json"
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

// TestRolloutLinesHostile: the names of the clusters a rollout reached
// (a kubeconfig Secret's label) and a halted rollout's message (what a
// trigger's failure said) print in a plan escaped, on the rollout's one
// line; JSON holds them exactly.
func TestRolloutLinesHostile(t *testing.T) {
	const hostile = "x\x1b[2J\x1b]0;pwned\x07\r\nPlan: 0 to create\u202e\u009b"
	for _, r := range []rollout.Status{
		{Rule: "staged", ByCluster: true, Reached: []string{hostile}, Record: rollout.Record{State: rollout.Progressing, Step: 1, Steps: 3, To: hostile}},
		{Rule: "staged", Record: rollout.Record{State: rollout.Halted, Step: 1, Steps: 3, To: hostile, Message: hostile}},
	} {
		var out bytes.Buffer
		printRollout(PlanOptions{Stdout: &out}, r)
		line := strings.TrimSuffix(out.String(), "\n")
		if strings.ContainsAny(line, "\x1b\r\n\u202e\u009b") || !strings.Contains(line, `x\x1b[2J\x1b]0;pwned\a\r\nPlan: 0 to create\u202e\u009b`) {
			t.Errorf("plan's rollout line is not one line of escaped values: %q", out.String())
		}
		out.Reset()
		printRollout(PlanOptions{Stdout: &out, JSON: true}, r)
		var back struct {
			Rollout struct {
				Clusters []string `json:"clusters"`
				Message  string   `json:"message"`
			} `json:"rollout"`
		}
		if err := json.Unmarshal(out.Bytes(), &back); err != nil || back.Rollout.Message != r.Message || r.ByCluster && back.Rollout.Clusters[0] != hostile {
			t.Errorf("plan's JSON rollout does not hold the values exactly (%v): %s", err, out.String())
		}
	}
}
