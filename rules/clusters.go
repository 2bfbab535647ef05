package rules

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules/expr"
)

// Fleets: a resource whose children go to other clusters.

// LabelClusterName is the label Cluster API puts on a cluster's kubeconfig
// Secret (<name>-kubeconfig, key value): the Secret is a cluster of
// syncloop's inventory, named by the label's value.
const LabelClusterName = "cluster.x-k8s.io/cluster-name"

// Cluster is a cluster of the inventory as rules see it: its name and
// labels (its kubeconfig Secret's), never its credentials.
type Cluster struct {
	Name   string
	Labels map[string]string
}

// Value is the cluster as expressions read it: cluster.name, cluster.labels.
func (c Cluster) Value() map[string]any {
	labels := make(map[string]any, len(c.Labels))
	for k, v := range c.Labels {
		labels[k] = v
	}
	return map[string]any{"name": c.Name, "labels": labels}
}

// Clusters says which clusters of the inventory a resource's children go
// to: each selected cluster gets the resource's children, rendered with
// cluster (name, labels) in their expressions. Triggers and lookups stay in
// syncloop's own cluster.
type Clusters struct {
	// Selector, when set, picks each cluster of the inventory it holds for
	// (cluster, and the trigger, variables and lookups).
	Selector *Expression
	// Names, when set, names the clusters: literal or ${} over the
	// trigger; a name the inventory lacks is a cluster not reachable.
	Names []Text
	// OnLeave is what becomes of the children in a cluster the trigger
	// selects no more (relabelled, renamed, or the trigger changed):
	// Orphan (default) leaves them as they are; Delete deletes them,
	// within the rule's prune budget there (rollout.maxPrunes of the
	// rule's children in that cluster).
	OnLeave DeletionPolicy
	Pos     Pos
	Field   string
}

// Targets reports whether the resource's children go to other clusters.
func (r *Resource) Targets() bool { return r.Clusters != nil }

// Many reports whether children.<id> is a list: one child per forEach
// item, per cluster, or what a function returns.
func (r *Resource) Many() bool { return r.ForEach != nil || r.Function != nil || r.Clusters != nil }

// TargetsClusters reports whether any resource of the rule puts children in
// other clusters.
func (r *Rule) TargetsClusters() bool {
	return slices.ContainsFunc(r.Resources, (*Resource).Targets)
}

// decodeClusters decodes a resource's clusters: a selector or names.
func (d *decoder) decodeClusters(res *Resource, n *yaml.Node, field string, c *expr.Compiler, scope expr.Scope) {
	field += ".clusters"
	f := d.fields(n, field, "selector", "names", "onLeave")
	if f == nil {
		return
	}
	cl := &Clusters{Pos: d.pos(resolve(n)), Field: field, OnLeave: DeletionOrphan}
	decodeOneOf(d, f, field, "onLeave", &cl.OnLeave, DeletionOrphan, DeletionDelete)
	// Which clusters is known before the resource's dependencies are:
	// neither reads children.
	scope.Children = nil
	sel, hasSel := f["selector"]
	names, hasNames := f["names"]
	switch {
	case hasSel && hasNames:
		d.errorf(n, field, "a selector or names, not both")
		return
	case hasSel:
		scope.Cluster = true
		cl.Selector = d.expression(sel, field+".selector", c, scope, expr.BoolResult)
	case hasNames:
		for i, nn := range d.seq(names, field+".names") {
			cl.Names = append(cl.Names, d.text(nn, fmt.Sprintf("%s.names[%d]", field, i), c, scope))
		}
		if len(cl.Names) == 0 {
			d.errorf(names, field+".names", "must name at least one cluster")
		}
	default:
		d.errorf(n, field, "a selector (CEL over cluster.name and cluster.labels) or names is required")
		return
	}
	res.Clusters = cl
}

// checkClusters reports what a resource that targets clusters cannot do.
func (d *decoder) checkClusters(res *Resource, n *yaml.Node, field string) {
	if res.Clusters == nil {
		return
	}
	switch {
	case d.tenant != "":
		d.errorf(n, field+".clusters", "a tenant rule of namespace %q stays in it: its children cannot go to other clusters", d.tenant)
	case res.Mode == ModePatch:
		d.errorf(n, field+".clusters", "a mode: patch resource writes onto objects in syncloop's own cluster: leave clusters out")
	case res.Function != nil:
		d.errorf(n, field+".clusters", "a function's children are in syncloop's own cluster: clusters takes a template")
	case res.createOnceSet && res.CreateOnce:
		d.errorf(n, field+".clusters", "children in other clusters are kept as the template says: createOnce is for children in syncloop's own cluster")
	case res.DeletionPolicy == DeletionOrphan && res.Clusters.OnLeave == DeletionDelete:
		d.errorf(n, field+".clusters.onLeave", "deletionPolicy: Orphan never deletes a child: onLeave: Delete cannot either; leave one of them out")
	}
}

// literalNames are the literal names of c, sorted; nil when one is a
// template (any cluster may be named).
func (c *Clusters) literalNames() []string {
	var out []string
	for _, t := range c.Names {
		if !t.IsLiteral() {
			return nil
		}
		out = append(out, t.Literal)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MayTarget reports whether some trigger may select cl: false only when
// the names are literal and cl is not among them (a selector may read the
// trigger: any cluster may be picked).
func (c *Clusters) MayTarget(cl Cluster) bool {
	if c.Selector != nil {
		return true
	}
	names := c.literalNames()
	return names == nil || slices.Contains(names, cl.Name)
}

// kubeconfigSuffix ends the name of a kubeconfig Secret of Cluster API's.
const kubeconfigSuffix = "-kubeconfig"

// ClusterOf is the cluster a kubeconfig Secret stands for, if it is one:
// it carries Cluster API's cluster-name label, and is named by its value
// (by the Secret's name less -kubeconfig when the value is empty). Its
// labels are the Secret's.
func ClusterOf(secret metav1.Object) (Cluster, bool) {
	name, ok := secret.GetLabels()[LabelClusterName]
	if !ok {
		return Cluster{}, false
	}
	if name == "" {
		name = strings.TrimSuffix(secret.GetName(), kubeconfigSuffix)
	}
	return Cluster{Name: name, Labels: maps.Clone(secret.GetLabels())}, true
}

// ClustersOf are the clusters the kubeconfig Secrets among objs stand for
// (ClusterOf), by name: the inventory of an offline render.
func ClustersOf(objs []*unstructured.Unstructured) []Cluster {
	var out []Cluster
	for _, o := range objs {
		if o.GetKind() != "Secret" || o.GetAPIVersion() != "v1" {
			continue
		}
		if c, ok := ClusterOf(o); ok && !slices.ContainsFunc(out, func(x Cluster) bool { return x.Name == c.Name }) {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b Cluster) int { return strings.Compare(a.Name, b.Name) })
	return out
}
