package engine

import (
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/syncloop/syncloop/rules"
)

// Indexes on the child informers. A rule's child informers hold its own
// children (childKey); a rule's revisions during a rollout share them.
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
	rule, owner := rules.Label(m, rules.LabelRule), rules.Annotation(m, rules.AnnotationOwner)
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
	if rule := rules.Label(m, rules.LabelRule); rule != "" {
		return []string{rule}, nil
	}
	return nil, nil
}

func ownerKey(rule, owner string) string { return rule + " " + owner }
