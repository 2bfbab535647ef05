package engine

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
)

var gizmosGVR = schema.GroupVersionResource{Group: "test.syncloop.dev", Version: "v1", Resource: "gizmos"}

// TestRejectedChildren: children the API server rejects — an invalid name,
// a schema violation, an admission policy's denial — fail only their own
// trigger. Each gets a Failed Event carrying the API server's message and
// is retried with exponential backoff; their siblings, the other triggers
// and another rule carry on.
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
		h.eventually("a Failed event on "+trigger+" quoting the API server", func() bool {
			for _, e := range h.events("Failed") {
				if e.InvolvedObject.Name == trigger && strings.Contains(e.Message, message) {
					return true
				}
			}
			return false
		})
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

	// Retries back off exponentially: attempt k comes (2^k - 1) base
	// delays after the first, so the attempts in a time T are at most
	// log2(T/base + 1) + 1; a child event may add one. A hot loop would
	// make hundreds.
	var first time.Time
	attempts := func() int {
		n := 0
		for _, r := range h.counter.Requests(nil) {
			if r.Method == "PATCH" && strings.HasSuffix(r.Path, "/configmaps/Bad_Name") {
				if n == 0 {
					first = r.Time
				}
				n++
			}
		}
		return n
	}
	h.eventually("the rejected child to be retried", func() bool { return attempts() >= 5 })
	n, elapsed := attempts(), time.Since(first)
	if limit := int(math.Log2(float64(elapsed)/float64(baseDelay)+1)) + 2; n > limit {
		t.Errorf("%d attempts in %v: more than exponential backoff from %v allows (%d)", n, elapsed, baseDelay, limit)
	}
	t.Logf("%d attempts in %v", n, elapsed.Round(time.Millisecond))
	for _, s := range h.engine.States() {
		if s.State != stateRunning {
			t.Errorf("rule %s is %s, want running", s.Rule, s.State)
		}
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
			FailurePolicy: ptrTo(admissionv1.Fail),
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
