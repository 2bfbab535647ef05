package testenv

import (
	"context"
	"fmt"
	"net/http"
	"time"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// TightAPIServerArgs make the API server's total concurrency 20 seats
// (API Priority and Fairness divides --max-requests-inflight plus
// --max-mutating-requests-inflight among the priority levels by their
// shares), so that a priority level of 1 share out of the built-in 245 gets
// exactly one seat: see OneSeat.
var TightAPIServerArgs = []string{"--max-requests-inflight=10", "--max-mutating-requests-inflight=10"}

// OneSeat puts every request of the ServiceAccount namespace/name into a
// priority level of its own that — on a control plane started with
// TightAPIServerArgs — runs one request at a time, neither lends nor
// borrows seats, and rejects what it cannot run at once with 429 Too Many
// Requests and a Retry-After: the pushback a busy cluster gives a
// controller. (system:masters, the admin identity, is exempt from API
// Priority and Fairness; a ServiceAccount is not.) The ServiceAccount is
// bound to cluster-admin. OneSeat returns the ServiceAccount's config once
// its requests are classified into the new priority level.
func (e *Env) OneSeat(ctx context.Context, namespace, name string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(e.config)
	if err != nil {
		return nil, err
	}
	sa, err := e.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	id := "one-seat-" + namespace + "-" + name
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: id},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	pl := &flowcontrolv1.PriorityLevelConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: id},
		Spec: flowcontrolv1.PriorityLevelConfigurationSpec{
			Type: flowcontrolv1.PriorityLevelEnablementLimited,
			Limited: &flowcontrolv1.LimitedPriorityLevelConfiguration{
				NominalConcurrencyShares: ptr.To[int32](1),
				LendablePercent:          ptr.To[int32](0),
				BorrowingLimitPercent:    ptr.To[int32](0),
				LimitResponse:            flowcontrolv1.LimitResponse{Type: flowcontrolv1.LimitResponseTypeReject},
			},
		},
	}
	pl, err = cs.FlowcontrolV1().PriorityLevelConfigurations().Create(ctx, pl, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating the priority level: %w", err)
	}
	subject := flowcontrolv1.Subject{Kind: flowcontrolv1.SubjectKindServiceAccount,
		ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: name}}
	fs := &flowcontrolv1.FlowSchema{
		ObjectMeta: metav1.ObjectMeta{Name: id},
		Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: id},
			MatchingPrecedence:         100, // before the built-in service-accounts schema (9000)
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{subject},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{
					Verbs: []string{"*"}, APIGroups: []string{"*"}, Resources: []string{"*"},
					ClusterScope: true, Namespaces: []string{"*"},
				}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: []string{"*"}, NonResourceURLs: []string{"*"}}},
			}},
		},
	}
	if _, err := cs.FlowcontrolV1().FlowSchemas().Create(ctx, fs, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating the flow schema: %w", err)
	}
	// The API server applies new flow control objects within a second or
	// so; a response names the priority level that served it.
	client, err := rest.HTTPClientFor(sa)
	if err != nil {
		return nil, err
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, sa.Host+"/api/v1/namespaces/"+namespace, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		last = resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)
		return last == string(pl.UID), nil
	})
	if err != nil {
		return nil, fmt.Errorf("requests of %s/%s not yet in priority level %s (last served by %q): %w", namespace, name, id, last, err)
	}
	return sa, nil
}
