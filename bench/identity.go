package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sdynamic "k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/syncloop/syncloop/internal/testenv"
)

// identityRule is rule I of the identity phase: a child per trigger,
// acting as ServiceAccount SA of the namespace.
const identityRule = `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: bench-id-I}
spec:
  serviceAccountName: SA
  serviceAccountNamespace: NS
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: bench-trigger}
  resources:
    - id: child
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-I"}
        data: {value: "${object.data.value}"}
  resyncPeriod: "0"
`

// IdentityResult is the identity phase's outcome: N rules over the same
// triggers, acting as syncloop's own identity, as one ServiceAccount, and
// each as a ServiceAccount of its own.
type IdentityResult struct {
	Rules    int           `json:"rules"`
	Triggers int           `json:"triggers"`
	Runs     []IdentityRun `json:"runs"`
}

// IdentityRun is one way of the identity phase: the heap once converged
// (after GC, above the engine's baseline before any rule), the informers,
// the seconds to converge and the requests made in a quiet window after.
type IdentityRun struct {
	ActAs          string  `json:"actAs"`
	HeapMiB        float64 `json:"heapMiB"`
	Informers      int     `json:"informers"`
	Seconds        float64 `json:"seconds"`
	SteadyRequests int     `json:"steadyRequests"`
}

// runIdentities converges rules × triggers children three times, each in
// a namespace of its own: every rule as syncloop's own identity and every
// rule as one ServiceAccount (either way the trigger informer shared, a
// child informer per rule: each caches its own children), and each rule as
// a ServiceAccount of its own (a trigger informer each too).
func runIdentities(ctx context.Context, env *testenv.Env, nRules, triggers int, logf func(string, ...any)) (*IdentityResult, error) {
	res := &IdentityResult{Rules: nRules, Triggers: triggers}
	for _, actAs := range []string{"syncloop's own identity", "one ServiceAccount", fmt.Sprintf("%d ServiceAccounts", nRules)} {
		sa := func(i int) string {
			switch {
			case strings.HasPrefix(actAs, "syncloop"):
				return ""
			case actAs == "one ServiceAccount":
				return "bench-sa"
			}
			return fmt.Sprintf("bench-sa-%d", i)
		}
		run, err := identitiesOnce(ctx, env, nRules, triggers, sa)
		if err != nil {
			return nil, err
		}
		run.ActAs = actAs
		res.Runs = append(res.Runs, run)
		logf("identities: %d rules × %d triggers as %s: %.1f MiB, %d informers, %.2fs, %d requests at steady state", nRules, triggers, actAs, run.HeapMiB, run.Informers, run.Seconds, run.SteadyRequests)
	}
	return res, nil
}

func identitiesOnce(ctx context.Context, env *testenv.Env, nRules, triggers int, sa func(int) string) (IdentityRun, error) {
	admin, err := kubernetes.NewForConfig(env.Config())
	if err != nil {
		return IdentityRun{}, err
	}
	var text []string
	for i := range nRules {
		rule := strings.NewReplacer("bench-id-I", fmt.Sprintf("bench-id-%d", i), "-I\"", fmt.Sprintf("-%d\"", i), "SA", sa(i)).Replace(identityRule)
		if sa(i) == "" {
			rule = strings.NewReplacer("  serviceAccountName: \n", "", "  serviceAccountNamespace: NS\n", "").Replace(rule)
		}
		text = append(text, rule)
	}
	w := configMapWorkload(strings.Join(text, "---\n"))
	_, _, set, err := w.prepare(ctx, env, triggers, "bench-identity-", func(ns string, _ k8sdynamic.Interface) error {
		return grantConfigMaps(ctx, admin, ns, nRules, sa)
	})
	if err != nil {
		return IdentityRun{}, err
	}
	counter := &testenv.RequestCounter{}
	eng, m, _, _, err := newEngine(counter.Wrap(syncloopConfig(env.Config(), Config{})), nRules*triggers)
	if err != nil {
		return IdentityRun{}, err
	}
	base := heapAfterGC()
	start := time.Now()
	_, stop := runEngine(ctx, eng, set, nil)
	defer stop()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Minute, true, func(context.Context) (bool, error) {
		return m.writes.Load() >= int64(nRules*triggers), nil
	}); err != nil {
		return IdentityRun{}, fmt.Errorf("syncloop did not converge: %d of %d children", m.writes.Load(), nRules*triggers)
	}
	run := IdentityRun{Seconds: time.Unix(0, m.reached.Load()).Sub(start).Seconds()}
	time.Sleep(2 * time.Second) // the echoes of the creates
	counter.Reset()
	time.Sleep(5 * time.Second)
	run.SteadyRequests = len(counter.Requests(nil))
	run.HeapMiB = float64(int64(heapAfterGC())-int64(base)) / (1 << 20)
	run.Informers = eng.Informers()
	runtime.KeepAlive(eng)
	return run, nil
}

// grantConfigMaps makes the ServiceAccounts sa(0..n-1) of ns (one or n
// distinct) and lets each manage ConfigMaps there.
func grantConfigMaps(ctx context.Context, cs kubernetes.Interface, ns string, n int, sa func(int) string) error {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i := range n {
		name := sa(i)
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "bench"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// reportIdentities is the Markdown table of the identity phase.
func reportIdentities(r *IdentityResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s — identities: %d rules over the same %d triggers, a child each\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.Rules, r.Triggers)
	fmt.Fprintf(&b, "syncloop's defaults, in process; the rules act as syncloop's own identity, as one ServiceAccount (impersonated) or as one each. Heap after GC above the engine's baseline, once converged; requests counted over 5 s of quiet after.\n\n")
	fmt.Fprintf(&b, "| rules act as | heap | informers | converge %d children | requests at steady state |\n|---|---|---|---|---|\n", r.Rules*r.Triggers)
	for _, run := range r.Runs {
		fmt.Fprintf(&b, "| %s | %.1f MiB | %d | %.2f s | %d |\n", run.ActAs, run.HeapMiB, run.Informers, run.Seconds, run.SteadyRequests)
	}
	if n := len(r.Runs); n == 3 {
		fmt.Fprintf(&b, "| heap, %s / one | %.2f | | | |\n", r.Runs[2].ActAs, r.Runs[2].HeapMiB/r.Runs[1].HeapMiB)
	}
	return b.String()
}
