package rules

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ServiceAccount is a ServiceAccount a rule acts as: every request of the
// rule (its lists, watches, lookups and writes) impersonates it, so that
// RBAC bounds what the rule may do. The zero value is syncloop's own
// identity.
type ServiceAccount struct {
	Namespace, Name string
}

// IsZero reports whether s names no ServiceAccount: syncloop's own identity.
func (s ServiceAccount) IsZero() bool { return s.Name == "" }

// String is namespace/name, "" for syncloop's own identity.
func (s ServiceAccount) String() string {
	if s.IsZero() {
		return ""
	}
	return s.Namespace + "/" + s.Name
}

// UserName is the user the API server knows the ServiceAccount as
// (system:serviceaccount:<namespace>:<name>); impersonating it without
// naming groups, the API server adds the ServiceAccount's groups itself.
func (s ServiceAccount) UserName() string {
	return "system:serviceaccount:" + s.Namespace + ":" + s.Name
}

// ParseServiceAccount parses NAMESPACE/NAME (--default-service-account).
func ParseServiceAccount(s string) (ServiceAccount, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return ServiceAccount{}, fmt.Errorf("service account %q: want NAMESPACE/NAME", s)
	}
	sa := ServiceAccount{Namespace: ns, Name: name}
	if err := sa.validate(); err != nil {
		return ServiceAccount{}, fmt.Errorf("service account %q: %w", s, err)
	}
	return sa, nil
}

func (s ServiceAccount) validate() error {
	if errs := validation.IsDNS1123Label(s.Namespace); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", s.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(s.Name); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", s.Name, strings.Join(errs, "; "))
	}
	return nil
}

// DefaultServiceAccountNamespace is the namespace of a rule's
// serviceAccountName when neither the rule nor the loader
// (Loader.SetIdentities) says: the namespace syncloop runs in when it
// runs outside a cluster.
const DefaultServiceAccountNamespace = "default"

// identities say who the rules of a load act as when they do not name a
// ServiceAccount, and where a serviceAccountName without namespace lives.
type identities struct {
	home string         // syncloop's namespace
	def  ServiceAccount // --default-service-account; zero: syncloop's own
}

// SetIdentities says who the rules of later loads act as: a rule's
// serviceAccountName without serviceAccountNamespace is in home (syncloop's
// namespace; "" is DefaultServiceAccountNamespace), and a rule naming no
// ServiceAccount acts as def (zero: syncloop's own identity).
func (l *Loader) SetIdentities(home string, def ServiceAccount) error {
	if home == "" {
		home = DefaultServiceAccountNamespace
	}
	if errs := validation.IsDNS1123Label(home); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", home, strings.Join(errs, "; "))
	}
	if !def.IsZero() {
		if err := def.validate(); err != nil {
			return fmt.Errorf("default service account: %w", err)
		}
	}
	l.identities = identities{home: home, def: def}
	return nil
}

// decodeIdentity decodes spec.serviceAccountName and
// spec.serviceAccountNamespace into r.Identity, defaulted as the loader
// says.
func (d *decoder) decodeIdentity(r *Rule, f map[string]*yaml.Node) {
	r.Identity = d.identities.def
	nsNode, hasNS := f["serviceAccountNamespace"]
	n, ok := f["serviceAccountName"]
	if !ok {
		if hasNS {
			d.errorf(nsNode, "spec.serviceAccountNamespace", "needs spec.serviceAccountName")
		}
		return
	}
	name, ok := d.dnsName(n, "spec.serviceAccountName", "ServiceAccount name", validation.IsDNS1123Subdomain)
	if !ok {
		return
	}
	ns := d.identities.home
	if hasNS {
		if ns, ok = d.dnsName(nsNode, "spec.serviceAccountNamespace", "namespace", validation.IsDNS1123Label); !ok {
			return
		}
	}
	r.Identity = ServiceAccount{Namespace: ns, Name: name}
}

// dnsName decodes a string that valid says is a valid name (what it
// names).
func (d *decoder) dnsName(n *yaml.Node, field, what string, valid func(string) []string) (string, bool) {
	v, ok := d.str(n, field)
	if !ok {
		return "", false
	}
	if errs := valid(v); len(errs) > 0 {
		d.errorf(n, field, "%q is not a valid %s: %s", v, what, strings.Join(errs, "; "))
		return "", false
	}
	return v, true
}
