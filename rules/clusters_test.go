package rules

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// fleetDoc is a rule whose resource targets clusters as CLUSTERS says.
const fleetDoc = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: spread}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: apps}
TEARDOWN  resources:
    - id: copy
CLUSTERS      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}", namespace: default}
        data: {cluster: "${cluster.name}"}
`

func fleetRule(clusters, teardown string) string {
	return strings.NewReplacer("CLUSTERS", clusters, "TEARDOWN", teardown).Replace(fleetDoc)
}

// TestClusters: a resource targets clusters by selector or by names; it
// is a list (one child per cluster), its triggers are torn down in order
// (held until every cluster answers), and what it cannot be is refused
// where it is written.
func TestClusters(t *testing.T) {
	r := parseRule(t, fleetRule("      clusters: {selector: \"cluster.labels.?env.orValue('') == 'prod'\"}\n", ""))
	res := r.Resources[0]
	if !res.Targets() || !res.Many() || !r.TargetsClusters() || !r.OrdersTeardown() {
		t.Errorf("targets %v, many %v, rule targets %v, ordered teardown %v", res.Targets(), res.Many(), r.TargetsClusters(), r.OrdersTeardown())
	}
	if got := r.TeardownOrder(); !strings.Contains(got, "its children go at once: copy") {
		t.Errorf("teardown order %q: one wave goes at once", got)
	}
	if !res.Clusters.MayTarget(Cluster{Name: "any"}) {
		t.Error("a selector may pick any cluster")
	}
	if res.Clusters.OnLeave != DeletionOrphan {
		t.Errorf("onLeave %q by default, want Orphan: a cluster that leaves keeps its children", res.Clusters.OnLeave)
	}
	if r := parseRule(t, fleetRule("      clusters: {selector: \"true\", onLeave: Delete}\n", "")); r.Resources[0].Clusters.OnLeave != DeletionDelete {
		t.Errorf("onLeave %q, want Delete", r.Resources[0].Clusters.OnLeave)
	}

	r = parseRule(t, fleetRule("      clusters: {names: [east, west, east]}\n", ""))
	if cl := r.Resources[0].Clusters; !cl.MayTarget(Cluster{Name: "west"}) || cl.MayTarget(Cluster{Name: "north"}) {
		t.Error("literal names may target only the clusters they name")
	}
	r = parseRule(t, fleetRule("      clusters: {names: [\"${object.metadata.labels.region}\"]}\n", ""))
	if !r.Resources[0].Clusters.MayTarget(Cluster{Name: "north"}) {
		t.Error("a templated name may target any cluster")
	}

	for _, c := range []struct{ clusters, teardown, want string }{
		{"      clusters: {selector: \"true\", names: [a]}\n", "", `rule.yaml:8:17: rule "spread": spec.resources[0].clusters: a selector or names, not both`},
		{"      clusters: {}\n", "", `spec.resources[0].clusters: a selector (CEL over cluster.name and cluster.labels) or names is required`},
		{"      clusters: {names: []}\n", "", `spec.resources[0].clusters.names: must name at least one cluster`},
		{"      clusters: {selector: \"'prod'\"}\n", "", `spec.resources[0].clusters.selector`},
		{"      clusters: {selector: \"true\"}\n      createOnce: true\n", "", `createOnce is for children in syncloop's own cluster`},
		{"      clusters: {selector: \"true\"}\n", "  teardown: Unordered\n", `spec.teardown`},
		{"      clusters: {selector: \"true\", onLeave: Keep}\n", "", `spec.resources[0].clusters.onLeave: must be Orphan or Delete, not "Keep"`},
		{"      clusters: {selector: \"true\", onLeave: Delete}\n      deletionPolicy: Orphan\n", "", `spec.resources[0].clusters.onLeave: deletionPolicy: Orphan never deletes a child`},
		{"", "", `spec.resources[0].template.data.cluster: ${cluster.name}: undeclared reference to 'cluster': cluster is known in a resource that targets clusters (clusters:)`},
		{"      clusters: {selector: \"size(clusters) > 0\"}\n", "", `spec.resources[0].clusters.selector: undeclared reference to 'clusters': clusters (what is where in the clusters of the fleet) is known in the status`},
	} {
		_, err := newLoader(t).Parse("rule.yaml", []byte(fleetRule(c.clusters, c.teardown)))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("clusters %q, teardown %q: error %v, want it to contain %s", c.clusters, c.teardown, err, c.want)
		}
	}

	doc := strings.Replace(fleetRule("      clusters: {selector: \"true\"}\n", ""), "namespace: apps}", "}", 1)
	doc = strings.Replace(doc, "namespace: default}", "}", 1)
	if _, err := tenantLoader(t, "team-a").Parse("cm.yaml", []byte(doc)); err == nil || !strings.Contains(err.Error(), `a tenant rule of namespace "team-a" stays in it: its children cannot go to other clusters`) {
		t.Errorf("a tenant rule that targets clusters: %v", err)
	}
}

// TestClustersOf: the offline inventory is the Secrets that carry Cluster
// API's cluster-name label, named by it (or by the Secret's name less
// -kubeconfig), labelled with the Secret's labels; other objects are not
// clusters.
func TestClustersOf(t *testing.T) {
	secret := func(name string, labels map[string]string) *unstructured.Unstructured {
		s := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "fleet", Labels: labels}}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
		if err != nil {
			t.Fatal(err)
		}
		return &unstructured.Unstructured{Object: m}
	}
	cm := secret("east-kubeconfig", map[string]string{LabelClusterName: "east"})
	cm.SetKind("ConfigMap")
	got := ClustersOf([]*unstructured.Unstructured{
		secret("east-kubeconfig", map[string]string{LabelClusterName: "east", "env": "prod"}),
		secret("west-kubeconfig", map[string]string{LabelClusterName: ""}),
		secret("plain", nil),
		cm,
	})
	if len(got) != 2 || got[0].Name != "east" || got[0].Labels["env"] != "prod" || got[1].Name != "west" {
		t.Fatalf("clusters %+v, want east (env prod) and west", got)
	}
	if v := got[0].Value(); v["name"] != "east" || v["labels"].(map[string]any)["env"] != "prod" {
		t.Errorf("value %v", v)
	}
}
