package manager

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules/reload"
)

// Event reasons on the rules ConfigMap.
const (
	ReasonRuleFileNotLoaded = "RuleFileNotLoaded"
	ReasonRulesLoaded       = "RulesLoaded"
)

// maxEventMessage keeps an Event's message readable (the API allows more).
const maxEventMessage = 1024

// announcer says on the ConfigMap the rule files come from why a file
// did not load — a Warning Event per failed file, with its file:line:col
// errors — and, once every file loads again, a Normal Event: so that
// `kubectl describe configmap` after a GitOps sync shows why a rule did
// not change. It says each state once, not on every reload.
type announcer struct {
	configMap types.NamespacedName // empty: nothing to announce on
	core      kubernetes.Interface
	recorder  record.EventRecorder

	mu   sync.Mutex
	last string // the errors last announced
}

// announce announces errs, the files of the last load that failed, unless
// they were announced already; rules is the rules in force.
func (a *announcer) announce(ctx context.Context, errs []reload.FileError, rules int) {
	if a == nil || a.configMap.Name == "" || a.recorder == nil {
		return
	}
	var key strings.Builder
	for _, e := range errs {
		key.WriteString(e.Error() + "\x00")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if key.String() == a.last {
		return
	}
	// The ConfigMap as it is: its uid is how kubectl describe finds them.
	cm, err := a.core.CoreV1().ConfigMaps(a.configMap.Namespace).Get(ctx, a.configMap.Name, metav1.GetOptions{})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reading the rules ConfigMap to put the load's outcome on it", "configMap", a.configMap)
		return
	}
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: cm.Namespace, Name: cm.Name,
		UID: cm.UID, ResourceVersion: cm.ResourceVersion}
	if len(errs) == 0 { // and some did not load before
		a.recorder.Eventf(ref, corev1.EventTypeNormal, ReasonRulesLoaded, "every rule file loads again: %d rule(s) in force", rules)
	}
	for _, e := range errs {
		a.recorder.Event(ref, corev1.EventTypeWarning, ReasonRuleFileNotLoaded, eventMessage(e.Error()))
	}
	a.last = key.String()
}

// parseConfigMap parses --rules-configmap: NAMESPACE/NAME, or NAME in
// namespace.
func parseConfigMap(s, namespace string) (types.NamespacedName, error) {
	if s == "" {
		return types.NamespacedName{}, nil
	}
	ns, name, found := strings.Cut(s, "/")
	if !found {
		ns, name = namespace, s
	}
	if ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("rules-configmap %q: want NAMESPACE/NAME", s)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
