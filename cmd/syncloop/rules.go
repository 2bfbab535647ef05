package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/internal/manager"
	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// ruleFlags are the flags of every command that loads rules.
type ruleFlags struct {
	paths        []string
	costLimit    uint64
	installation string
	// defaultSA is --default-service-account, NAMESPACE/NAME; home the
	// namespace of a serviceAccountName given without one (syncloop's).
	defaultSA, home string
	// tenant is --tenant: the rules are a tenant's of that namespace.
	tenant string
	// served, when set, is the cluster's CRDs the kinds rules define are
	// checked against; manageCRDs as run --manage-crds.
	served     rules.CRDSource
	manageCRDs bool
	// webhook is where the CRDs of kinds of several versions send their
	// conversions.
	webhook webhookFlags
	// loader is what load loaded with.
	loader *rules.Loader
}

func (f *ruleFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVarP(&f.paths, "rules", "f", nil,
		"rule file or directory (repeatable); directories are walked for *.yaml and *.yml, dotfiles skipped")
	cmd.Flags().Uint64Var(&f.costLimit, "cel-cost-limit", expr.DefaultCostLimit, "CEL cost limit of one expression evaluation")
	_ = cmd.MarkFlagRequired("rules")
}

// registerInstallation adds --installation, for the commands whose rules
// act in (or render for) a cluster.
func (f *ruleFlags) registerInstallation(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.installation, "installation", "", "the name of this installation of syncloop, which its children carry (label "+rules.LabelInstallation+"), so that installations in one cluster never take each other's children (default: the default installation, whose children carry none)")
}

// registerIdentity adds --default-service-account, for the commands that
// act on a cluster as the rules would.
func (f *ruleFlags) registerIdentity(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.defaultSA, "default-service-account", "", "NAMESPACE/NAME of the ServiceAccount every rule without spec.serviceAccountName acts as: its requests impersonate it, so RBAC bounds what the rules may do (default: syncloop's own identity)")
}

// registerTenant adds --tenant, for the commands that check rules
// without a cluster.
func (f *ruleFlags) registerTenant(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.tenant, "tenant", "", "load the rules as the tenant rules of this namespace (as --tenant-rules reads them from a ConfigMap there): named <namespace>.<name>, acting as a ServiceAccount of the namespace, and confined to it — a watch, lookup or child elsewhere or of a cluster-scoped kind is an error")
}

// defaultServiceAccount is --default-service-account; zero when not given.
func (f *ruleFlags) defaultServiceAccount() (rules.ServiceAccount, error) {
	if f.defaultSA == "" {
		return rules.ServiceAccount{}, nil
	}
	sa, err := rules.ParseServiceAccount(f.defaultSA)
	if err != nil {
		return sa, fmt.Errorf("--default-service-account: %w", err)
	}
	return sa, nil
}

// load loads the rule set, its templates, expressions and scopes checked
// against the built-in kinds (or the cluster's, when cl is not nil), the
// CustomResourceDefinitions among the rule files and those among crds; on
// error it prints every problem, one per line, to stderr and returns
// exitCode 1.
func (f *ruleFlags) load(stderr io.Writer, cl *manager.Clients, crds ...*unstructured.Unstructured) (*rules.Set, error) {
	l, err := f.newLoader(cl, crds...)
	if err != nil {
		return nil, err
	}
	set, err := l.Load(f.paths...)
	if err != nil {
		var list rules.ErrorList
		if errors.As(err, &list) {
			printLoadError(stderr, err)
			fmt.Fprintf(stderr, "%d error(s)\n", len(list))
			return nil, exitCode(1)
		}
		return nil, err
	}
	for _, f := range set.Files() {
		for _, w := range f.Warnings {
			fmt.Fprintln(stderr, printable.Block(w.Error(), "  "))
		}
		if klog.V(2).Enabled() {
			for _, n := range f.Notes {
				fmt.Fprintln(stderr, printable.Block(n.Error(), "  "))
			}
		}
	}
	return set, nil
}

// printLoadError prints each error of an ErrorList on its own line (the
// lines of one error's detail indented under it). What an error quotes
// of a file is made printable: a file cannot act on the terminal, or
// pass a line of its own for an error's.
func printLoadError(w io.Writer, err error) {
	var list rules.ErrorList
	if errors.As(err, &list) {
		for _, e := range list {
			fmt.Fprintln(w, printable.Block(e.Error(), "  "))
		}
		return
	}
	fmt.Fprintln(w, printable.Block(err.Error(), "  "))
}

// newLoader is the loader of the flags: installation, identities,
// conversion webhook, tenant; the cluster's schemas and scopes when cl is
// not nil, and crds's kinds.
func (f *ruleFlags) newLoader(cl *manager.Clients, crds ...*unstructured.Unstructured) (*rules.Loader, error) {
	l, err := rules.NewLoader(expr.Options{CostLimit: f.costLimit})
	if err != nil {
		return nil, err
	}
	if err := l.SetInstallation(f.installation); err != nil {
		return nil, fmt.Errorf("--%w", err)
	}
	sa, err := f.defaultServiceAccount()
	if err != nil {
		return nil, err
	}
	if err := l.SetIdentities(f.home, sa); err != nil {
		return nil, err
	}
	wh, err := f.webhook.config()
	if err != nil {
		return nil, err
	}
	l.SetConversionWebhook(wh)
	if f.tenant != "" {
		if l, err = l.ForTenant(f.tenant); err != nil {
			return nil, fmt.Errorf("--%w", err)
		}
	}
	if cl != nil {
		l.UseSchemas(cl.Schemas)
		l.UseScopes(cl.Mapper)
	}
	l.UseCRDs(crds)
	if f.served != nil {
		l.UseServedCRDs(f.served, f.manageCRDs)
	}
	f.loader = l
	return l, nil
}
