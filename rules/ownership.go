package rules

import (
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// AnnotationAdopt, put on an object by its owner with a rule's name as the
// value, lets that rule take the object over although the rule does not
// say adopt: true.
const AnnotationAdopt = Group + "/adopt"

// AnnotationRuleHash, on a revision of a rule, is the rule's Hash: the
// revision's identity.
const AnnotationRuleHash = Group + "/rule-hash"

// NamespacedName is "<namespace>/<name>", or the name of a cluster-scoped
// object.
func (r ObjectRef) NamespacedName() string {
	if r.Namespace == "" {
		return r.Name
	}
	return r.Namespace + "/" + r.Name
}

// Trigger identifies a trigger object the way syncloop's annotations name
// it: apiVersion/kind/namespace/name.
type Trigger struct {
	APIVersion, Kind, Namespace, Name string
	UID                               string
}

// TriggerOf describes obj.
func TriggerOf(obj *unstructured.Unstructured) Trigger {
	return Trigger{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(),
		Name: obj.GetName(), UID: string(obj.GetUID())}
}

// String is the value of the syncloop.dev/owner annotation.
func (t Trigger) String() string {
	return t.APIVersion + "/" + t.Kind + "/" + t.Namespace + "/" + t.Name
}

// ParseTrigger parses a syncloop.dev/owner annotation,
// "<apiVersion>/<kind>/<namespace>/<name>" (apiVersion may hold a slash).
func ParseTrigger(s string) (Trigger, bool) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 4:
		return Trigger{APIVersion: parts[0], Kind: parts[1], Namespace: parts[2], Name: parts[3]}, true
	case 5:
		return Trigger{APIVersion: parts[0] + "/" + parts[1], Kind: parts[2], Namespace: parts[3], Name: parts[4]}, true
	}
	return Trigger{}, false
}

// FieldManager is the field manager of the rule's applies and status:
// syncloop/<rule>, or syncloop@<installation>/<rule> in a named
// installation. Its patches' managers add /<trigger digest>.
func (r *Rule) FieldManager() string {
	if r.Installation == "" {
		return FieldManagerPrefix + r.Name
	}
	return "syncloop@" + r.Installation + "/" + r.Name
}

// IsPatchManager reports whether manager names the patches of some rule
// of some installation: syncloop[@<installation>]/<rule>/<trigger digest>.
func IsPatchManager(manager string) bool {
	rest, ok := strings.CutPrefix(manager, FieldManagerPrefix)
	if !ok {
		var named bool
		if rest, named = strings.CutPrefix(manager, "syncloop@"); !named {
			return false
		}
		if _, rest, ok = strings.Cut(rest, "/"); !ok {
			return false
		}
	}
	return strings.Count(rest, "/") == 1
}
