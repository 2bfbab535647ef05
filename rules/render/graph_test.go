package render

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncloop/syncloop/rules"
)

// chainRule: cm reads svc's allocated address and waits for it; status
// reads readiness. Resource order in the file is not dependency order.
const chainRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: chain}
spec:
  watch: {apiVersion: example.com/v1, kind: App}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-addr"}
        data:
          address: "${children.svc.spec.clusterIP}:80"
          literal: "children.db is not a reference"
    - id: svc
      readyWhen:
        - self.spec.?clusterIP.orValue('') != ''
      template:
        apiVersion: v1
        kind: Service
        metadata: {name: "${object.metadata.name}"}
        spec: {ports: [{port: 80}]}
    - id: db
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-db"}
  status:
    address: "${children.?cm.?data.?address.orValue('')}"
    svcReady: ${ready.svc}
`

var graphScopes = scopes{"ConfigMap": true, "Service": true, "App": true}

// TestGraphWaits: with an applier whose Service has no address yet, cm
// waits and is not rendered; db, independent, is applied; the condition
// names svc. Once the address is there, cm renders it.
func TestGraphWaits(t *testing.T) {
	r := parseRule(t, chainRule)
	trigger := obj("example.com/v1", "App", "shop", "web", nil)
	var applied []string
	ip := ""
	ap := applierFunc(func(c Child) (map[string]any, error) {
		applied = append(applied, c.ResourceID)
		live := c.Object.DeepCopy().Object
		if c.ResourceID == "svc" && ip != "" {
			live["spec"].(map[string]any)["clusterIP"] = ip
		}
		return live, nil
	})
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: graphScopes, Applier: ap})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(applied, " "); got != "svc db" {
		t.Errorf("applied %q, want %q", got, "svc db")
	}
	if w := rd.Waiting(); len(w) != 1 || w[0].Resource.ID != "cm" || w[0].WaitingFor.ID != "svc" {
		t.Fatalf("waiting %+v, want cm waiting for svc", w)
	}
	c := rd.Readiness()
	if c.Status || c.Reason != "WaitingForSvc" || !strings.Contains(c.Message, `readyWhen "self.spec.?clusterIP.orValue('') != ''" is false`) || !strings.Contains(c.Message, "waiting: cm") {
		t.Errorf("condition %+v", c)
	}
	status, err := rd.Status(context.Background())
	if err != nil || status["svcReady"] != false || status["address"] != "" {
		t.Errorf("status %v, %v", status, err)
	}

	applied, ip = nil, "10.0.0.7"
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: trigger, Scoper: graphScopes, Applier: ap})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(applied, " "); got != "svc cm db" {
		t.Errorf("applied %q, want %q", got, "svc cm db")
	}
	if got := rd.Children[1].Object.Object["data"].(map[string]any)["address"]; got != "10.0.0.7:80" {
		t.Errorf("address %v", got)
	}
	if c := rd.Readiness(); !c.Status || c.Reason != ReasonAllResourcesReady {
		t.Errorf("condition %+v", c)
	}
	if status, _ := rd.Status(context.Background()); status["svcReady"] != true || status["address"] != "10.0.0.7:80" {
		t.Errorf("status %v", status)
	}
}

// TestGraphFailureAndExclusion: a dependency that fails to apply makes its
// dependents wait; one whose when is false excludes them.
func TestGraphFailureAndExclusion(t *testing.T) {
	doc := strings.Replace(chainRule, "    - id: svc\n", "    - id: svc\n      when: object.metadata.name != 'off'\n", 1)
	r := parseRule(t, doc)
	boom := errors.New("boom")
	ap := applierFunc(func(c Child) (map[string]any, error) {
		if c.ResourceID == "svc" {
			return nil, boom
		}
		return c.Object.Object, nil
	})
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "shop", "web", nil), Scoper: graphScopes, Applier: ap})
	if err != nil {
		t.Fatal(err)
	}
	if svc := rd.Resources[0]; svc.Resource.ID != "svc" || !errors.Is(svc.Err, boom) || svc.Ready || len(rd.Waiting()) != 1 {
		t.Errorf("svc %+v, waiting %d: want svc failed with boom, not ready, and cm waiting", svc, len(rd.Waiting()))
	}
	rd, err = Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "shop", "off", nil), Scoper: graphScopes, Applier: ap})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range rd.Resources {
		if want := st.Resource.ID != "db"; st.Excluded != want {
			t.Errorf("%s excluded %v, want %v (%s)", st.Resource.ID, st.Excluded, want, st.Why)
		}
	}
	if c := rd.Readiness(); !c.Status || c.Message != "the resource is ready" {
		t.Errorf("condition %+v: excluded resources do not count", c)
	}
}

// TestGraphOffline: offline, the Service's address is unknown, shown as
// such; the readyWhen that cannot hold is noted; cm is rendered anyway.
func TestGraphOffline(t *testing.T) {
	r := parseRule(t, chainRule)
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("example.com/v1", "App", "shop", "web", nil), Scoper: graphScopes})
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Children) != 3 {
		t.Fatalf("%d children, want 3 (dependents rendered offline)", len(rd.Children))
	}
	if got := rd.Children[1].Object.Object["data"].(map[string]any)["address"]; got != "(known after apply: children.svc.spec.clusterIP):80" {
		t.Errorf("address %q", got)
	}
	if len(rd.Notes) != 1 || !strings.Contains(rd.Notes[0], `resource "svc": spec.resources[1].readyWhen[0] cannot hold on the rendered child`) {
		t.Errorf("notes %q", rd.Notes)
	}
}

func TestDeletionPolicyPerResource(t *testing.T) {
	r := parseRule(t, head+watchNS+"  deletionPolicy: Orphan\n  resources:\n    - id: a\n      deletionPolicy: Delete\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: a, namespace: x}}\n    - id: b\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: b, namespace: x}}\n")
	if r.Resources[0].DeletionPolicy != rules.DeletionDelete || r.Resources[1].DeletionPolicy != rules.DeletionOrphan {
		t.Errorf("policies %s %s, want Delete (own) and Orphan (the rule's)", r.Resources[0].DeletionPolicy, r.Resources[1].DeletionPolicy)
	}
	// An orphaned resource's child has no ownerReference: the garbage
	// collector leaves it too.
	rd, err := Rule(context.Background(), Input{Rule: r, Trigger: obj("v1", "Namespace", "", "x", nil), Scoper: scopes{"ConfigMap": true, "Namespace": false}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rd.Children[0].Object.GetOwnerReferences()) != 1 || len(rd.Children[1].Object.GetOwnerReferences()) != 0 {
		t.Errorf("ownerReferences %v / %v, want one on a only", rd.Children[0].Object.GetOwnerReferences(), rd.Children[1].Object.GetOwnerReferences())
	}
}

func TestConditions(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	other := map[string]any{"type": "Synced", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
	waiting := Condition{Status: false, Reason: "WaitingForDb", Message: "m"}
	got := waiting.Conditions([]any{other}, nil, 3, t0)
	if len(got) != 2 || got[0].(map[string]any)["type"] != "Synced" {
		t.Fatalf("conditions %v: other types must stay", got)
	}
	ready := got[1].(map[string]any)
	if fmt.Sprint(ready) != "map[lastTransitionTime:2026-11-30T12:00:00Z message:m observedGeneration:3 reason:WaitingForDb status:False type:Ready]" {
		t.Errorf("ready %v", ready)
	}
	// Same status later: lastTransitionTime kept, even with a new message.
	waiting.Message = "m2"
	again := waiting.Conditions(got, nil, 4, t0.Add(time.Hour))
	if r := again[1].(map[string]any); r["lastTransitionTime"] != "2026-11-30T12:00:00Z" || r["message"] != "m2" || r["observedGeneration"] != int64(4) {
		t.Errorf("unchanged status: %v", r)
	}
	// A transition moves it.
	done := Condition{Status: true, Reason: ReasonAllResourcesReady, Message: "ok"}.Conditions(again, nil, 4, t0.Add(2*time.Hour))
	if r := done[1].(map[string]any); r["lastTransitionTime"] != "2026-11-30T14:00:00Z" || r["status"] != "True" {
		t.Errorf("transition: %v", r)
	}
	// The rule's own conditions merge by type; syncloop's Ready wins.
	mine := []any{map[string]any{"type": "Synced", "status": "False"}, map[string]any{"type": "Ready", "status": "True"}}
	merged := waiting.Conditions([]any{other}, mine, 0, t0)
	if len(merged) != 2 || merged[0].(map[string]any)["status"] != "False" || merged[1].(map[string]any)["status"] != "False" {
		t.Errorf("merged %v", merged)
	}
	if _, ok := merged[1].(map[string]any)["observedGeneration"]; ok {
		t.Errorf("observedGeneration set for an object without generation")
	}
	if camel("team-config") != "TeamConfig" || camel("db2") != "Db2" {
		t.Errorf("camel: %s %s", camel("team-config"), camel("db2"))
	}
}
