package render

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
)

const clustersRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: spread}
spec:
  watch: {apiVersion: v1, kind: ConfigMap}
  resources:
    - id: prod
      clusters: {selector: "cluster.labels.?env.orValue('') == 'prod'"}
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}", namespace: default}
        data: {cluster: "${cluster.name}", tier: "${cluster.labels.?tier.orValue('none')}"}
    - id: named
      clusters: {names: [east, "${object.data.extra}"]}
      readyWhen: ["self.?data.?ok.orValue('') == 'yes'"]
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-named", namespace: default}
  status:
    clusters: ${clusters}
    allReady: ${clusters.all(c, c.ready)}
`

// TestRenderClusters: a resource's children go to each cluster its
// selector picks, rendered with that cluster's name and labels; a cluster
// the applier cannot reach, or a name the inventory lacks, makes the
// resource wait (Ready ClusterUnreachable) without failing the render.
func TestRenderClusters(t *testing.T) {
	r := parseRule(t, clustersRule)
	secret := func(name string, labels map[string]any) *unstructured.Unstructured {
		labels[rules.LabelClusterName] = name
		return obj("v1", "Secret", "fleet", name+"-kubeconfig", labels)
	}
	inventory := Objects{
		secret("east", map[string]any{"env": "prod", "tier": "gold"}),
		secret("west", map[string]any{"env": "prod"}),
		secret("lab", map[string]any{"env": "dev"}),
	}
	trigger := obj("v1", "ConfigMap", "apps", "web", nil)
	trigger.Object["data"] = map[string]any{"extra": "gone"}
	var applied []string
	ap := applierFunc(func(c Child) (map[string]any, error) {
		if c.Cluster == "west" {
			return nil, &UnreachableError{Cluster: "west", Why: "connection refused"}
		}
		applied = append(applied, c.Cluster+"/"+c.Object.GetName())
		return c.Object.Object, nil
	})
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: inventory, Clusters: inventory, Applier: ap})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(applied)
	if got := strings.Join(applied, " "); got != "east/web east/web-named" {
		t.Errorf("applied %s, want east/web east/web-named", got)
	}
	for _, c := range rd.Children {
		if c.Cluster == "east" && c.Resource.ID == "prod" {
			if d := c.Object.Object["data"].(map[string]any); d["cluster"] != "east" || d["tier"] != "gold" {
				t.Errorf("east's child rendered with %v", d)
			}
		}
		if len(c.Object.GetOwnerReferences()) > 0 {
			t.Errorf("a child in cluster %s has an ownerReference", c.Cluster)
		}
	}
	selected, unreachable := rd.Selected()
	if !slices.Equal(selected["prod"], []string{"east", "west"}) || !slices.Equal(unreachable, []string{"gone", "west"}) {
		t.Errorf("selected %v, unreachable %v", selected, unreachable)
	}
	ready := rd.Readiness()
	if ready.Status || ready.Reason != ReasonClusterUnreachable || !strings.Contains(ready.Message, `"gone", "west"`) {
		t.Errorf("Ready %+v, want False ClusterUnreachable naming gone and west", ready)
	}

	// The status reads what is where: east answers, but its named child
	// is not ready; west does not answer; gone is not in the inventory.
	status, got := statusClusters(t, rd)
	if want := "east:false:ChildrenNotReady gone:false:ClusterUnreachable west:false:ClusterUnreachable"; got != want || status["allReady"] != false {
		t.Errorf("status clusters %s (all ready %v), want %s", got, status["allReady"], want)
	}
	if m := status["clusters"].([]any)[0].(map[string]any); !strings.Contains(fmt.Sprint(m["message"]), `ConfigMap default/web-named: readyWhen`) {
		t.Errorf("east's message %q, want the readyWhen of its named child", m["message"])
	}

	// Offline, the inventory is the Secrets given; lab is not prod.
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: inventory, Clusters: inventory, Recorded: Recorded{Objects: inventory}})
	if err != nil {
		t.Fatal(err)
	}
	var where []string
	for _, c := range rd.Children {
		where = append(where, c.Resource.ID+"@"+c.Cluster)
	}
	slices.Sort(where)
	if got := strings.Join(where, " "); got != "named@east prod@east prod@west" {
		t.Errorf("offline children %s", got)
	}
	if notes := strings.Join(rd.Notes, "\n"); !strings.Contains(notes, `cluster "gone" is not among the kubeconfig Secrets given`) {
		t.Errorf("notes %s", notes)
	}
}

// TestRenderHeldClusters: a child the applier holds back for a rollout by
// cluster (HeldError) fails nothing and is not applied; the cluster's
// children wait there as they are (Selected), the status says
// RolloutPending for it, and so does Ready once everything else is
// ready — but not before.
func TestRenderHeldClusters(t *testing.T) {
	r := parseRule(t, clustersRule)
	secret := func(name string) *unstructured.Unstructured {
		return obj("v1", "Secret", "fleet", name+"-kubeconfig", map[string]any{rules.LabelClusterName: name, "env": "prod"})
	}
	inventory := Objects{secret("east"), secret("west")}
	trigger := obj("v1", "ConfigMap", "apps", "web", nil)
	trigger.Object["data"] = map[string]any{"extra": "east"}
	render := func(namedReady bool) *Rendered {
		t.Helper()
		var applied []string
		ap := applierFunc(func(c Child) (map[string]any, error) {
			if c.Cluster == "west" {
				return nil, &HeldError{Cluster: "west", Why: "step 2 of 2"}
			}
			applied = append(applied, c.Cluster+"/"+c.Object.GetName())
			live := c.Object.DeepCopy().Object
			if namedReady {
				live["data"] = map[string]any{"ok": "yes"}
			}
			return live, nil
		})
		rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: testScopes, Lookups: inventory, Clusters: inventory, Applier: ap})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(applied)
		if got := strings.Join(applied, " "); got != "east/web east/web-named" {
			t.Errorf("applied %s, want east's alone", got)
		}
		return rd
	}
	rd := render(false)
	if c := rd.Readiness(); c.Reason != ReasonWaitingFor+"Named" {
		t.Errorf("Ready %+v with east's child not ready, want WaitingForNamed", c)
	}
	rd = render(true)
	if _, waiting := rd.Selected(); !slices.Equal(waiting, []string{"west"}) {
		t.Errorf("children waiting in %v, want west", waiting)
	}
	c := rd.Readiness()
	if c.Status || c.Reason != ReasonRolloutPending || !strings.Contains(c.Message, `"west"`) {
		t.Errorf("Ready %+v, want False RolloutPending naming west", c)
	}
	if _, got := statusClusters(t, rd); got != "east:true:<nil> west:false:RolloutPending" {
		t.Errorf("status clusters %s, want east ready and west RolloutPending", got)
	}
}

// statusClusters renders rd's status and says its clusters as
// name:ready:reason, in order.
func statusClusters(t *testing.T, rd *Rendered) (map[string]any, string) {
	t.Helper()
	status, err := rd.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range status["clusters"].([]any) {
		m := c.(map[string]any)
		got = append(got, fmt.Sprintf("%s:%v:%v", m["name"], m["ready"], m["reason"]))
	}
	return status, strings.Join(got, " ")
}
