package fleet

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// One cluster, one Secret. Two kubeconfig Secrets whose API servers are
// the same are one cluster under two names: the reconciles of each name
// would find the other's children there, prune them, and make their own
// again, without end. The older Secret (created first; by name, for two
// created in the same second) keeps the cluster; the other is left out
// of the inventory as a kubeconfig that makes no client is — a Warning
// Event on it and the metric, nothing done there under its name — and
// comes in once the first leaves or names another server. Two names of
// one API server that differ (an IP and a DNS name) are not told apart.

// serverOf is the API server host (a rest.Config's) names, as two
// kubeconfigs naming the same one would: scheme and host in lower case,
// the scheme's port when none is said, the path without a trailing /.
func serverOf(host string) string {
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		return strings.ToLower(strings.TrimSuffix(host, "/"))
	}
	scheme, hostname, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[scheme]
	}
	return scheme + "://" + hostname + ":" + port + strings.TrimSuffix(u.EscapedPath(), "/")
}

// alias is the cluster of another Secret that has c's API server; nil
// when none has.
func (inv *Inventory) alias(c *cluster) *cluster {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	for _, other := range inv.clusters {
		if other.source.Name != c.source.Name && other.server == c.server {
			return other
		}
	}
	return nil
}

// olderThan reports whether a's Secret came before b's: the one that
// keeps a cluster two Secrets name.
func (a *cluster) olderThan(b *cluster) bool {
	ta, tb := a.source.CreationTimestamp, b.source.CreationTimestamp
	if !ta.Equal(&tb) {
		return ta.Before(&tb)
	}
	return a.source.Name < b.source.Name
}

// refuse leaves c, the cluster of a Secret, out of the inventory: holder,
// another Secret's cluster, has its API server. It is put again when the
// holder leaves (readmit).
func (inv *Inventory) refuse(ctx context.Context, c, holder *cluster) {
	inv.mu.Lock()
	inv.refused[c.source.Name] = c.source
	inv.mu.Unlock()
	inv.invalid(ctx, c.source, c.Name, fmt.Errorf("its API server %s is cluster %q's already, whose Secret %s is older: one Secret per cluster (two names for one cluster would each prune the other's children)",
		c.server, holder.Name, holder.source.Name))
}

// readmit puts again the Secrets refused as another's cluster: that
// cluster may have left, or named another server.
func (inv *Inventory) readmit(ctx context.Context) {
	inv.mu.Lock()
	refused := inv.refused
	inv.refused = map[string]*corev1.Secret{}
	inv.mu.Unlock()
	for _, s := range refused {
		klog.FromContext(ctx).V(2).Info("A Secret refused as another's cluster is put again", "secret", klog.KObj(s))
		inv.put(ctx, s)
	}
}
