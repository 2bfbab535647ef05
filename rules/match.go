package rules

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/selection"
)

// MatchesOffline reports whether the watch selects obj, as the API server
// would: apiVersion, kind, namespace, label selector, and the field
// selector's requirements on metadata.name and metadata.namespace. Other
// field requirements cannot be evaluated without the server; they are
// returned, and treated as matching.
func (w Watch) MatchesOffline(obj *unstructured.Unstructured) (match bool, notEvaluated []string) {
	if obj.GetAPIVersion() != w.APIVersion || obj.GetKind() != w.Kind {
		return false, nil
	}
	if w.Namespace != "" && obj.GetNamespace() != w.Namespace {
		return false, nil
	}
	if !w.LabelSelector.Matches(Labels(obj)) {
		return false, nil
	}
	for _, req := range w.FieldSelector.Requirements() {
		var actual string
		switch req.Field {
		case "metadata.name":
			actual = obj.GetName()
		case "metadata.namespace":
			actual = obj.GetNamespace()
		default:
			notEvaluated = append(notEvaluated, req.Field+string(req.Operator)+req.Value)
			continue
		}
		equal := actual == req.Value
		switch req.Operator {
		case selection.Equals, selection.DoubleEquals:
			if !equal {
				return false, notEvaluated
			}
		case selection.NotEquals:
			if equal {
				return false, notEvaluated
			}
		}
	}
	return true, notEvaluated
}
