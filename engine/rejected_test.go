package engine

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/syncloop/syncloop/internal/testenv"
)

var gizmosGVR = schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "gizmos"}

// TestRejectedChildren: children the API server rejects — an invalid name,
// a schema violation, an admission policy's denial — fail only their own
// trigger. Each gets a Failed Event carrying the API server's message and
// is retried with exponential backoff; their siblings, the other triggers
// and another rule carry on.
//
// API server: the server rejecting a child: name validation, CRD schema,
// admission policy.
func TestRejectedChildren(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	if _, err := h.env.InstallCRDs(ctx, filepath.Join("testdata", "gizmos-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	const denial = "children may not set data.deny"
	h.denyInNamespace(denial, "!has(object.data) || !('deny' in object.data)")

	const baseDelay = 20 * time.Millisecond
	h.start(h.loadRules(fmt.Sprintf(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: strict}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: strict}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.data.name}"}
        data: "${'forbid' in object.data ? {'deny': 'yes'} : {}}"
    - id: gizmo
      template:
        apiVersion: test.syncloop.dev/v1
        kind: Gizmo
        metadata: {name: "${object.metadata.name}-gizmo"}
        spec: {size: "${int(object.data.size)}"}
  resyncPeriod: "0"
  rateLimit: {baseDelay: %v, maxDelay: 10s}
---
`, baseDelay) + copyRule))
	mk := func(name string, data map[string]string) {
		h.createCM(name, map[string]string{"strict": "1"}, data)
	}
	mk("good", map[string]string{"name": "good-cm", "size": "1"})
	mk("badname", map[string]string{"name": "Bad_Name", "size": "1"})
	mk("schema", map[string]string{"name": "schema-cm", "size": "99"})
	mk("denied", map[string]string{"name": "denied-cm", "size": "1", "forbid": "x"})
	h.createCM("other", map[string]string{"copy": "yes"}, map[string]string{"k": "v"})

	// Each failing trigger gets the API server's own words.
	for trigger, message := range map[string]string{
		"badname": "a lowercase RFC 1123 subdomain",
		"schema":  "should be less than or equal to 10",
		"denied":  denial,
	} {
		h.waitForFailed(trigger, message)
	}
	// Everything else was made: the good trigger's children, the siblings
	// of each rejected child, the other rule's child.
	gizmos := h.dynamic().Resource(gizmosGVR).Namespace(h.ns)
	for _, name := range []string{"good-gizmo", "badname-gizmo", "denied-gizmo"} {
		if _, err := gizmos.Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("gizmo %s: %v", name, err)
		}
	}
	for _, name := range []string{"good-cm", "schema-cm", "other-copy"} {
		if _, ok := h.configMap(h.ns, name); !ok {
			t.Errorf("ConfigMap %s was not made", name)
		}
	}
	if _, ok := h.configMap(h.ns, "denied-cm"); ok {
		t.Error("the denied ConfigMap exists")
	}
	if _, err := gizmos.Get(ctx, "schema-gizmo", metav1.GetOptions{}); err == nil {
		t.Error("the Gizmo violating the schema exists")
	}

	// Retries back off exponentially.
	h.checkBackoff("applies of the rejected child", baseDelay, 5, func(r testenv.Request) bool {
		return r.Method == "PATCH" && strings.HasSuffix(r.Path, "/configmaps/Bad_Name")
	})
	for _, s := range h.engine.States() {
		if s.State != StateRunning {
			t.Errorf("rule %s is %s, want running", s.Rule, s.State)
		}
	}
}

// checkBackoff waits for at least min requests matching match, then
// checks that there are no more than exponential backoff from base allows
// since the first: attempt k comes at least (2^k - 1) base delays after the
// first, so a time T holds at most log2(T/base + 1) + 1 attempts (one more
// is allowed for a retry an event brings early). A hot loop would make
// hundreds. Only an upper bound: a slow machine makes fewer.
func (h *harness) checkBackoff(what string, base time.Duration, min int, match func(testenv.Request) bool) {
	h.t.Helper()
	h.checkBackoffOf(what, base, min, func() []time.Time {
		var out []time.Time
		for _, r := range h.counter.Requests(match) {
			out = append(out, r.Time)
		}
		return out
	})
}

// checkBackoffOf is checkBackoff over attempts made at the times times
// returns, in order.
func (h *harness) checkBackoffOf(what string, base time.Duration, min int, times func() []time.Time) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("%d %s", min, what), func() bool { return len(times()) >= min })
	at := times()
	n, elapsed := len(at), time.Since(at[0])
	if limit := int(math.Log2(float64(elapsed)/float64(base)+1)) + 2; n > limit {
		h.t.Errorf("%d %s in %v: more than exponential backoff from %v allows (%d)", n, what, elapsed, base, limit)
	}
}

// denyInNamespace installs a ValidatingAdmissionPolicy, bound to the test's
// namespace, that denies ConfigMaps for which validation is false, and
// waits until the API server enforces it.
func (h *harness) denyInNamespace(message, validation string) {
	h.t.Helper()
	ctx := h.t.Context()
	adm := h.cs.AdmissionregistrationV1()
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-" + h.ns},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: validation, Message: message}},
		},
	}
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy.Name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy.Name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{corev1.LabelMetadataName: h.ns},
			}},
		},
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(context.Background(), policy.Name, metav1.DeleteOptions{})
	})
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"deny": "x"}}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := h.cs.CoreV1().ConfigMaps(h.ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), message), nil
	})
	if err != nil {
		h.t.Fatalf("the admission policy is not enforced: %v", err)
	}
}

// recordingMetrics records the engine's WatchError, Write, Panicked and
// RuleRemoved calls. With panicOn set, a Write it says yes to panics
// after it is counted: a panic injected into the unit of work that made
// the write.
type recordingMetrics struct {
	mu      sync.Mutex
	counts  map[string]int // "resource reason"
	writes  map[string]int // "rule action"
	panics  map[string]int // "rule where"
	repairs map[string]int // "rule manager"
	calls   map[string]int // "rule resource transport result"
	// watching are the resources Watching announced; unannounced those
	// WatchError counted before.
	watching, unannounced map[string]bool
	removed               []string
	panicOn               func(rule, action string) bool
}

func (w *recordingMetrics) ReconcileDone(string, string, time.Duration) {}
func (w *recordingMetrics) Write(rule, action string) {
	w.mu.Lock()
	if w.writes == nil {
		w.writes = map[string]int{}
	}
	w.writes[rule+" "+action]++
	w.mu.Unlock()
	if w.panicOn != nil && w.panicOn(rule, action) {
		panic(fmt.Sprintf("injected into %s's %s", rule, action))
	}
}

func (w *recordingMetrics) Panicked(rule, where string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panics == nil {
		w.panics = map[string]int{}
	}
	w.panics[rule+" "+where]++
}

func (w *recordingMetrics) FunctionCalled(rule, resource, transport, result string, _ time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.calls == nil {
		w.calls = map[string]int{}
	}
	w.calls[rule+" "+resource+" "+transport+" "+result]++
}

func (w *recordingMetrics) DriftRepaired(rule, manager string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.repairs == nil {
		w.repairs = map[string]int{}
	}
	w.repairs[rule+" "+manager]++
}

func (w *recordingMetrics) repaired(rule, manager string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.repairs[rule+" "+manager]
}

func (w *recordingMetrics) panicked(rule, where string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.panics[rule+" "+where]
}

func (w *recordingMetrics) written(rule, action string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes[rule+" "+action]
}
func (w *recordingMetrics) RuleRemoved(rule string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removed = append(w.removed, rule)
}
func (w *recordingMetrics) WatchError(resource, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counts == nil {
		w.counts = map[string]int{}
	}
	w.counts[resource+" "+reason]++
	if !w.watching[resource] {
		if w.unannounced == nil {
			w.unannounced = map[string]bool{}
		}
		w.unannounced[resource] = true
	}
}

func (w *recordingMetrics) Watching(resource string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watching == nil {
		w.watching = map[string]bool{}
	}
	w.watching[resource] = true
}

func (w *recordingMetrics) count(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.counts[key]
}

// TestForbiddenKinds: syncloop runs as a user that may not list Secrets nor
// write ServiceAccounts. The rule watching Secrets reports why it cannot
// start (state detail, metric), its informer retries with backoff, and it
// starts once RBAC allows it; the rule whose child is forbidden gets a
// Failed Event; the rule with every right runs throughout.
//
// API server: RBAC refusing a list and a write.
func TestForbiddenKinds(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	rbac := h.cs.RbacV1().ClusterRoles()
	user := "limited-" + h.ns
	allow := func(rules ...rbacv1.PolicyRule) {
		t.Helper()
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
		if _, err := rbac.Get(ctx, user, metav1.GetOptions{}); err == nil {
			_, err = rbac.Update(ctx, role, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if _, err := rbac.Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	base := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: all},
		{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	allow(base...)
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := h.cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
		_ = rbac.Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	h.config = h.env.ImpersonatedConfig(user, "system:authenticated")
	errs := &recordingMetrics{}
	h.metrics = errs

	h.createCM("allowed", map[string]string{"copy": "yes"}, nil)
	h.createCM("account", map[string]string{"account": "yes"}, nil)
	if _, err := h.cs.CoreV1().Secrets(h.ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s", Labels: map[string]string{"keys": "yes"}},
		StringData: map[string]string{"password": "hunter2"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.startWith(h.loadRules(copyRule+`---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: secret-keys}
spec:
  watch: {apiVersion: v1, kind: Secret, namespace: NS, labelSelector: keys}
  resources:
    - id: keys
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: "${object.metadata.name}-keys"}
        data: {keys: "${object.data.map(k, k).join(',')}"}
---
apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: account}
spec:
  watch: {apiVersion: v1, kind: ConfigMap, namespace: NS, labelSelector: account}
  resources:
    - id: sa
      template: {apiVersion: v1, kind: ServiceAccount, metadata: {name: "${object.metadata.name}"}}
`), false)

	h.eventually("the allowed rule's child", func() bool { _, ok := h.configMap(h.ns, "allowed-copy"); return ok })
	state := func(rule string) RuleState {
		for _, s := range h.engine.States() {
			if s.Rule == rule {
				return s
			}
		}
		return RuleState{}
	}
	h.eventually("the Secret rule to report why it cannot start", func() bool {
		s := state("secret-keys")
		return s.State == StateSyncing && strings.Contains(s.Detail, "cannot list and watch secrets") && strings.Contains(s.Detail, "forbidden")
	})
	h.eventually("the forbidden watch to be counted", func() bool { return errs.count("secrets Forbidden") >= 2 })
	errs.mu.Lock()
	if len(errs.unannounced) > 0 || !errs.watching["secrets"] {
		// Its series would be made by its first error: an alert on the
		// increase of syncloop_watch_errors_total misses that one.
		t.Errorf("watch errors of %v counted before Metrics.Watching announced them (announced %v)", errs.unannounced, errs.watching)
	}
	errs.mu.Unlock()
	if h.engine.Ready() {
		t.Error("the engine is ready with a rule that cannot start")
	}
	// Writing a forbidden child fails that trigger only, with the reason.
	h.waitForFailed("account", "forbidden")
	if s := state("copy"); s.State != StateRunning {
		t.Errorf("the allowed rule is %s: %s", s.State, s.Detail)
	}

	// The reflector backs off from client-go's 800 ms; each attempt is a
	// watch-list request, then a plain list.
	h.checkBackoff("lists of Secrets", 800*time.Millisecond, 3, func(r testenv.Request) bool {
		return classify(r) == "list" && strings.HasSuffix(r.Path, "/secrets")
	})

	// Granted the right, the rule starts on its own.
	allow(append(base, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}})...)
	h.eventuallyWithin(90*time.Second, "the Secret rule to start once allowed", func() bool {
		cm, ok := h.configMap(h.ns, "s-keys")
		return ok && cm.Data["keys"] == "password"
	})
	if s := state("secret-keys"); s.State != StateRunning {
		t.Errorf("the Secret rule is %s: %s", s.State, s.Detail)
	}
}
