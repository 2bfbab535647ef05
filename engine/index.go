package engine

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/rules"
)

// Indexes on the child informers. Children are watched once per kind for
// all rules of an installation (childrenSelector), so that a rule sees
// when another rule already owns an object it wants: a conflict is
// reported instead of two rules taking an object from each other forever.
const (
	// ownerIndex: "<rule> <owner annotation>" → the children of one trigger.
	ownerIndex = "syncloop.dev/owner"
	// ruleIndex: "<rule>" → every child of a rule.
	ruleIndex = "syncloop.dev/rule"
)

func ownerIndexFunc(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	rule, owner := m.GetLabels()[rules.LabelRule], m.GetAnnotations()[rules.AnnotationOwner]
	if rule == "" || owner == "" {
		return nil, nil
	}
	return []string{ownerKey(rule, owner)}, nil
}

func ruleIndexFunc(obj any) ([]string, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	if rule := m.GetLabels()[rules.LabelRule]; rule != "" {
		return []string{rule}, nil
	}
	return nil, nil
}

func ownerKey(rule, owner string) string { return rule + " " + owner }

// parseOwner splits a syncloop.dev/owner annotation,
// "<apiVersion>/<kind>/<namespace>/<name>" (apiVersion may hold a slash).
func parseOwner(s string) (apiVersion, kind string, name cache.ObjectName, ok bool) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 4:
		return parts[0], parts[1], cache.ObjectName{Namespace: parts[2], Name: parts[3]}, true
	case 5:
		return parts[0] + "/" + parts[1], parts[2], cache.ObjectName{Namespace: parts[3], Name: parts[4]}, true
	}
	return "", "", cache.ObjectName{}, false
}
