package metrics

import "sync"

// Other is the label value that stands for every value past a label's
// bound: what others name — field managers, kinds, clusters, hosts, the
// reasons a remote API server gives — makes at most a bounded number of
// series, however many names they make up.
const Other = "other"

// The bounds of the labels whose values come from other parties
// (docs/seeing.md, "Metrics"): past them, a value is counted as Other.
const (
	// MaxManagers is how many field managers syncloop_drift_repairs_total
	// names per rule, besides the well-known ones.
	MaxManagers = 10
	// MaxResources is how many resources syncloop_watch_errors_total
	// names.
	MaxResources = 200
	// MaxReasons is how many reasons syncloop_watch_errors_total names
	// besides those known in advance.
	MaxReasons = 10
	// MaxClusters is how many clusters
	// syncloop_cluster_kubeconfig_errors_total names.
	MaxClusters = 100
	// MaxHosts is how many API server hosts rest_client_requests_total
	// names.
	MaxHosts = 100
)

// wellKnownManagers are the field managers of the writers most likely to
// change a child: always named, never counted against MaxManagers.
var wellKnownManagers = []string{"unknown", "before-first-apply",
	"kubectl", "kubectl-client-side-apply", "kubectl-edit", "kubectl-patch", "kubectl-label", "kubectl-annotate",
	"kubectl-replace", "kubectl-scale", "kubectl-set", "kubectl-rollout", "kubectl-create",
	"kube-controller-manager", "helm", "argocd-controller", "kustomize-controller", "helm-controller"}

// bounded admits the values of one label that come from other parties:
// the known ones always; of the others, the first max of each scope (a
// rule; "" for a label that is not by rule), and every later one as
// Other. Safe for concurrent use.
type bounded struct {
	max   int
	known map[string]bool

	mu   sync.Mutex
	seen map[string]map[string]bool // by scope: the values admitted that are not known
}

func newBounded(max int, known ...string) *bounded {
	b := &bounded{max: max, known: map[string]bool{}, seen: map[string]map[string]bool{}}
	for _, k := range known {
		b.known[k] = true
	}
	return b
}

// value is the label value v is counted under, in scope.
func (b *bounded) value(scope, v string) string {
	if b.known[v] {
		return v
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	seen := b.seen[scope]
	switch {
	case seen[v]:
		return v
	case len(seen) >= b.max:
		return Other
	case seen == nil:
		seen = map[string]bool{}
		b.seen[scope] = seen
	}
	seen[v] = true
	return v
}

// forget lets scope admit values anew: its series are gone.
func (b *bounded) forget(scope string) {
	b.mu.Lock()
	delete(b.seen, scope)
	b.mu.Unlock()
}
