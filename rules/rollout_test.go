package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/syncloop/syncloop/rules/expr"
)

func rolloutDoc(rollout string) string {
	return `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: r}
spec:
  watch: {apiVersion: v1, kind: ConfigMap}
  resources:
    - id: c
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}
` + rollout
}

func TestRollout(t *testing.T) {
	if got := parseRule(t, rolloutDoc("")).Rollout; !got.Equal(DefaultRollout) {
		t.Errorf("default: %+v", got)
	}
	got := parseRule(t, rolloutDoc("  rollout: {strategy: Progressive, step: 25, progressDeadline: 90s, maxFailures: 2, onFailure: Rollback, maxPrunes: 100%}\n")).Rollout
	want := Rollout{Strategy: RolloutProgressive, Step: Amount{Value: 25}, ProgressDeadline: 90 * time.Second, MaxFailures: 2,
		OnFailure: RolloutRollback, MaxPrunes: Amount{Value: 100, Percent: true}}
	if !got.Equal(want) {
		t.Errorf("rollout: %+v, want %+v", got, want)
	}
	// The rollout settings are not the revision: the hash stays.
	a, b := parseRule(t, rolloutDoc("")), parseRule(t, rolloutDoc("  rollout: {maxPrunes: 50%}\n"))
	if a.Hash != b.Hash {
		t.Error("spec.rollout changed the rule's hash")
	}
	if c := parseRule(t, rolloutDoc("  workers: 3\n")); c.Hash == a.Hash {
		t.Error("spec.workers did not change the rule's hash")
	}
	for _, tc := range []struct {
		amount   Amount
		of, want int
	}{
		{Amount{Value: 10, Percent: true}, 500, 50},
		{Amount{Value: 10, Percent: true}, 3, 1},
		{Amount{Value: 10, Percent: true}, 0, 0},
		{Amount{Value: 7}, 500, 7},
		{Amount{Value: 100, Percent: true}, 41, 41},
	} {
		if got := tc.amount.Of(tc.of); got != tc.want {
			t.Errorf("%s of %d = %d, want %d", tc.amount, tc.of, got, tc.want)
		}
	}
}

func TestRolloutErrors(t *testing.T) {
	l, err := NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ rollout, want string }{
		{"{strategy: Canary}", `rule.yaml:9:23: rule "r": spec.rollout.strategy: must be Progressive or Immediate, not "Canary"`},
		{"{step: 0}", `rule.yaml:9:19: rule "r": spec.rollout.step: must be at least 1 (or 1%), not 0`},
		{"{step: 150%}", `rule.yaml:9:19: rule "r": spec.rollout.step: must be a number or a percent from 0% to 100% (like 10%), not "150%"`},
		{"{step: ten}", `spec.rollout.step: must be a number or a percent`},
		{"{progressDeadline: 10ms}", `rule.yaml:9:31: rule "r": spec.rollout.progressDeadline: must be at least 1s, not 10ms`},
		{"{maxFailures: -1}", `spec.rollout.maxFailures: must be 0 or more, not -1`},
		{"{onFailure: Retry}", `spec.rollout.onFailure: must be Halt or Rollback, not "Retry"`},
		{"{maxPrune: 5}", `rule.yaml:9:13: rule "r": spec.rollout: unknown field "maxPrune" (did you mean "maxPrunes"?)`},
		{"{clusters: [{selector: \"cluster.name == 'a'\"}]}", `rule "r": spec.rollout.clusters: steps by cluster, and no resource of the rule targets clusters (clusters:)`},
	} {
		_, err := l.Parse("rule.yaml", []byte(rolloutDoc("  rollout: "+tc.rollout+"\n")))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rollout %s: %v, want %q", tc.rollout, err, tc.want)
		}
	}
}

// TestClusterRollout: steps by cluster are CEL over cluster alone; a
// cluster is in the first step whose selector holds for it, the others
// in the last.
func TestClusterRollout(t *testing.T) {
	doc := func(rollout string) string { // rolloutDoc's rule, its child in every cluster
		return strings.Replace(rolloutDoc("  rollout:\n"+rollout), "    - id: c\n", "    - id: c\n      clusters: {selector: \"true\"}\n", 1)
	}
	r := parseRule(t, doc(`    clusters:
      - selector: "cluster.labels.?canary.orValue('') == 'yes'"
      - selector: "cluster.labels.?region.orValue('') == 'eu'"
`))
	if !r.Rollout.ByCluster() || len(r.Rollout.Clusters) != 2 {
		t.Fatalf("rollout %+v: want two steps by cluster", r.Rollout)
	}
	for _, tc := range []struct {
		c    Cluster
		want int
	}{
		{Cluster{Name: "a", Labels: map[string]string{"canary": "yes", "region": "eu"}}, 0},
		{Cluster{Name: "b", Labels: map[string]string{"region": "eu"}}, 1},
		{Cluster{Name: "c", Labels: map[string]string{"region": "us"}}, 2},
		{Cluster{Name: "d"}, 2},
	} {
		if got := r.Rollout.ClusterStep(t.Context(), tc.c); got != tc.want {
			t.Errorf("cluster %s: step %d, want %d", tc.c.Name, got, tc.want)
		}
	}
	same := parseRule(t, doc(`    clusters:
      - selector: "cluster.labels.?canary.orValue('') == 'yes'"
      - selector: "cluster.labels.?region.orValue('') == 'eu'"
`))
	if !same.Rollout.Equal(r.Rollout) || same.Hash != r.Hash {
		t.Error("the same steps, parsed again, are not equal")
	}
	other := parseRule(t, doc(`    clusters: [{selector: "cluster.name == 'a'"}]
`))
	if other.Rollout.Equal(r.Rollout) || other.Hash != r.Hash {
		t.Error("other steps are equal, or changed the rule's hash")
	}

	l, err := NewLoader(expr.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ rollout, want string }{
		{"    clusters: [{selector: \"object.metadata.name == 'a'\"}]\n", `spec.rollout.clusters[0].selector: undeclared reference to 'object': a rollout's cluster steps read cluster (name, labels) alone`},
		{"    clusters: [{selector: \"cluster.name ==\"}]\n", `spec.rollout.clusters[0].selector`},
		{"    clusters: []\n", `spec.rollout.clusters: must list at least one step`},
		{"    clusters: [{}]\n", `spec.rollout.clusters[0].selector: required`},
		{"    strategy: Immediate\n    clusters: [{selector: \"true\"}]\n", `spec.rollout.clusters: steps by cluster, and strategy Immediate takes no steps`},
	} {
		_, err := l.Parse("rule.yaml", []byte(doc(tc.rollout)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rollout %s: %v, want %q", tc.rollout, err, tc.want)
		}
	}
}
