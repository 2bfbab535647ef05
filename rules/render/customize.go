package render

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// The rule function's customize function (Metacontroller's customize
// hook) says which objects the rule's function is given as related: it
// is given {controller, parent} and answers {relatedResources: [rules]},
// each rule a kind (apiVersion and resource, the plural) and which of its
// objects — in a namespace, by names, by labels. The objects are read
// through the Lookuper, like any lookup's: from the caches, and a change
// to them queues the trigger again. Its answer depends on the trigger
// alone, so it is kept (rules.Function.Memo) until the trigger changes.

// CustomizeRequest is what a customize function is given.
type CustomizeRequest struct {
	Controller map[string]any `json:"controller"`
	Parent     map[string]any `json:"parent"`
}

// RelatedRule is one rule of a customize function's answer.
type RelatedRule struct {
	APIVersion    string                `json:"apiVersion"`
	Resource      string                `json:"resource"`
	Namespace     string                `json:"namespace,omitempty"`
	Names         []string              `json:"names,omitempty"`
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
}

// Resourcer knows the resource (plural) a lookup's kind is served as;
// without one the plural is guessed from the kind, as kubectl does.
type Resourcer interface {
	Resource(l *rules.Lookup) string
}

// related calls the customize function of res's function (cust) for the
// trigger, or takes its kept answer, and reads the objects it names,
// by kind then name as a sync request has them. An answer is kept only
// once all of it is read: a wrong one is asked again.
func (w *graphWalk) related(ctx context.Context, res *rules.Resource, cust *rules.Function) (map[string]map[string]any, error) {
	uid, digest := string(w.in.Trigger.GetUID()), ""
	var data []byte
	kept := false
	if !w.offline { // offline, a test's recorded answer, never kept
		digest = parentDigest(w.in.Trigger)
		data, kept = cust.Memo.Get(uid, digest)
	}
	if !kept {
		in, err := json.Marshal(&CustomizeRequest{Controller: controllerOf(w.in.Rule), Parent: w.in.Trigger.Object})
		if err != nil {
			return nil, fmt.Errorf("its input: %w", err)
		}
		if data, err = w.call(ctx, res, cust, in); err != nil {
			return nil, fmt.Errorf("%s: %w", cust.Name(), err)
		}
	}
	out, err := decodeCustomizeResponse(data, w.rd.act.Budget)
	if errors.Is(err, expr.ErrTooLarge) {
		return nil, fmt.Errorf("%s: its answer: %w", cust.Name(), err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s returned no customize hook's response ({\"relatedResources\": [...]}): %v", cust.Name(), err)
	}
	related := map[string]map[string]any{}
	for i, rr := range out {
		field := fmt.Sprintf("relatedResources[%d]", i)
		l := w.relatedLookup(cust, rr)
		if l == nil {
			return nil, fmt.Errorf("%s returned %s apiVersion %s, resource %s: not among the kinds listed (%s)", cust.Name(), field,
				rr.APIVersion, rr.Resource, relatedNames(cust))
		}
		objs, err := w.readRelated(ctx, l, rr)
		if err != nil {
			return nil, fmt.Errorf("%s returned %s: %w", cust.Name(), field, err)
		}
		for _, o := range objs {
			byKind(related, w.in.Trigger, o)
		}
	}
	if !kept && !w.offline && uid != "" {
		cust.Memo.Put(uid, digest, data)
	}
	return related, nil
}

// decodeCustomizeResponse reads a customize function's answer, once b is
// charged for it (decodeJSON); a field it does not know fails it, as in a
// sync hook's response.
func decodeCustomizeResponse(data []byte, b *expr.Budget) ([]RelatedRule, error) {
	var top map[string]any
	if err := decodeJSON(data, b, &top); err != nil {
		return nil, err
	}
	for k := range top {
		if k != "relatedResources" {
			return nil, fmt.Errorf("unknown field %q", k)
		}
	}
	list, ok := top["relatedResources"].([]any)
	if v := top["relatedResources"]; !ok && v != nil {
		return nil, fmt.Errorf("relatedResources is %s, not a list", describe(v))
	}
	out := make([]RelatedRule, len(list))
	for i, e := range list {
		if err := relatedRule(e, &out[i]); err != nil {
			return nil, fmt.Errorf("relatedResources[%d] %w", i, err)
		}
	}
	return out, nil
}

// relatedRule reads one rule of a customize function's answer, decoded:
// an object of RelatedRule's fields, apiVersion and resource set.
func relatedRule(v any, rr *RelatedRule) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("is %s, not an object", describe(v))
	}
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(rr); err != nil {
		return fmt.Errorf("is no related resource rule: %w", err)
	}
	if rr.APIVersion == "" || rr.Resource == "" {
		return errors.New("needs apiVersion and resource")
	}
	return nil
}

// relatedLookup is the lookup of the kind rr names, or nil.
func (w *graphWalk) relatedLookup(cust *rules.Function, rr RelatedRule) *rules.Lookup {
	rs := w.in.Resources
	for _, l := range cust.Related {
		if l.APIVersion != rr.APIVersion {
			continue
		}
		plural := ""
		if rs != nil {
			plural = rs.Resource(l)
		}
		if plural == "" {
			guess, _ := meta.UnsafeGuessKindToResource(l.GVK)
			plural = guess.Resource
		}
		if plural == rr.Resource {
			return l
		}
	}
	return nil
}

// readRelated reads the objects of l that rr names. Its namespace is the
// trigger's for a namespaced kind unless rr says; names in a namespace
// are read one by one, anything else as a list.
func (w *graphWalk) readRelated(ctx context.Context, l *rules.Lookup, rr RelatedRule) ([]*unstructured.Unstructured, error) {
	namespaced, err := w.in.Scoper.Namespaced(l.GVK)
	if err != nil {
		return nil, err
	}
	ns := rr.Namespace
	switch {
	case !namespaced && ns != "":
		return nil, fmt.Errorf("%s is cluster-scoped: it has no namespace %q", l.Kind, ns)
	case namespaced && ns == "":
		ns = w.in.Trigger.GetNamespace()
	}
	sel := labels.Everything()
	if rr.LabelSelector != nil {
		if sel, err = metav1.LabelSelectorAsSelector(rr.LabelSelector); err != nil {
			return nil, fmt.Errorf("labelSelector: %w", err)
		}
	}
	if w.in.Lookups == nil {
		return nil, fmt.Errorf("no objects to look up %s in", l.Kind)
	}
	if len(rr.Names) > 0 && rr.LabelSelector == nil && (ns != "" || !namespaced) {
		var out []*unstructured.Unstructured
		for _, name := range rr.Names {
			objs, err := w.in.Lookups.Lookup(ctx, LookupQuery{Lookup: l, Namespace: ns, Name: name, Selector: labels.Everything()})
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
		return out, nil
	}
	objs, err := w.in.Lookups.Lookup(ctx, LookupQuery{Lookup: l, Namespace: ns, Selector: sel})
	if err != nil || len(rr.Names) == 0 {
		return objs, err
	}
	names := sets.New(rr.Names...)
	return slices.DeleteFunc(slices.Clone(objs), func(o *unstructured.Unstructured) bool { return !names.Has(o.GetName()) }), nil
}

// relatedNames lists the kinds cust may name, for messages.
func relatedNames(cust *rules.Function) string {
	names := make([]string, len(cust.Related))
	for i, l := range cust.Related {
		names[i] = l.APIVersion + " " + l.Kind
	}
	return strings.Join(names, ", ")
}

// parentDigest sums what a customize function may read of the trigger:
// all of it but its status and the fields every write changes.
func parentDigest(t *unstructured.Unstructured) string {
	top := maps.Clone(t.Object)
	delete(top, "status")
	if md, ok := top["metadata"].(map[string]any); ok {
		md = maps.Clone(md)
		for _, k := range []string{"resourceVersion", "managedFields", "generation"} {
			delete(md, k)
		}
		top["metadata"] = md
	}
	data, _ := json.Marshal(top)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
