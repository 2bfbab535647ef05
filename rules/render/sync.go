package render

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

// The rule's function (spec.function) speaks Metacontroller's
// CompositeController sync hook protocol, so that a hook server written
// for Metacontroller serves a rule unchanged: it is given the trigger as
// parent, the trigger's children in the cluster and the objects its
// lookups read, by kind; it returns the children it wants, the trigger's
// status and when to be called again.

// SyncRequest is what the rule's function is given, as JSON:
// Metacontroller's sync hook request, and syncloop's own fields beside it
// (a hook written for Metacontroller ignores them).
type SyncRequest struct {
	Controller map[string]any `json:"controller"`
	Parent     map[string]any `json:"parent"`
	// Children and Related are by kind ("Kind.version", or
	// "Kind.group/version") then name (namespace/name for a namespaced
	// object of a cluster-scoped parent). Related holds the objects the
	// rule's lookups read.
	Children   map[string]map[string]any `json:"children"`
	Related    map[string]map[string]any `json:"related"`
	Finalizing bool                      `json:"finalizing"`

	Rule      string         `json:"rule"`
	Variables map[string]any `json:"variables,omitempty"`
	Lookups   map[string]any `json:"lookups,omitempty"`
}

// SyncResponse is what the rule's function returns.
type SyncResponse struct {
	Status   map[string]any
	Children []map[string]any
	// ResyncAfter, when more than 0, is when the trigger is to be
	// reconciled again, whatever changes.
	ResyncAfter time.Duration
	// Finalized: a finalize call is done with the trigger.
	Finalized bool
}

// ChildLister says which children the trigger has in the cluster: the
// rule's function is given them. Without one (an offline render) the
// function is given none.
type ChildLister interface {
	Children(ctx context.Context) []*unstructured.Unstructured
}

// kindKey is how Metacontroller names a kind in a request's maps.
func kindKey(gvk schema.GroupVersionKind) string {
	if gvk.Group == "" {
		return gvk.Kind + "." + gvk.Version
	}
	return gvk.Kind + "." + gvk.Group + "/" + gvk.Version
}

// byKind adds obj to m, by its kind and its name relative to parent.
func byKind(m map[string]map[string]any, parent, obj *unstructured.Unstructured) {
	key := kindKey(obj.GroupVersionKind())
	if m[key] == nil {
		m[key] = map[string]any{}
	}
	name := obj.GetName()
	if parent.GetNamespace() == "" && obj.GetNamespace() != "" {
		name = obj.GetNamespace() + "/" + name
	}
	m[key][name] = obj.Object
}

// controllerOf is what a hook is given as its controller: a
// CompositeController named as the rule.
func controllerOf(r *rules.Rule) map[string]any {
	return map[string]any{"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": r.Name}}
}

// syncRequest is the request of res, the rule's function, for this
// render: related holds what its customize function names, if it has
// one, and what the rule's lookups read.
func (w *graphWalk) syncRequest(ctx context.Context, res *rules.Resource, finalizing bool) (*SyncRequest, error) {
	in := &SyncRequest{
		Controller: controllerOf(w.in.Rule), Parent: w.in.Trigger.Object, Children: map[string]map[string]any{}, Related: map[string]map[string]any{},
		Finalizing: finalizing, Rule: w.in.Rule.Name, Variables: w.rd.act.Variables, Lookups: w.rd.act.Lookups,
	}
	if cust := res.Function.Customize; cust != nil {
		related, err := w.related(ctx, res, cust)
		if err != nil {
			return nil, err
		}
		in.Related = related
	}
	for _, k := range res.Kinds {
		in.Children[kindKey(k.GVK)] = map[string]any{}
	}
	if w.in.Children != nil {
		for _, obj := range w.in.Children.Children(ctx) {
			byKind(in.Children, w.in.Trigger, obj)
		}
	}
	for _, v := range w.rd.act.Lookups {
		switch v := v.(type) {
		case map[string]any:
			byKind(in.Related, w.in.Trigger, &unstructured.Unstructured{Object: v})
		case []any:
			for _, e := range v {
				if m, ok := e.(map[string]any); ok {
					byKind(in.Related, w.in.Trigger, &unstructured.Unstructured{Object: m})
				}
			}
		}
	}
	return in, nil
}

// decodeSyncResponse reads what the rule's function returns: Metacontroller's
// sync hook response, once b is charged for it (decodeJSON). A field it
// does not know fails the call — a misspelt "children" must not read as
// none, which would prune them all.
func decodeSyncResponse(data []byte, b *expr.Budget) (*SyncResponse, error) {
	var out map[string]any
	if err := decodeJSON(data, b, &out); err != nil {
		return nil, err
	}
	resp := &SyncResponse{}
	for k, v := range out {
		switch k {
		case "children":
			list, err := objectList(v)
			if err != nil {
				return nil, err
			}
			resp.Children = list
		case "status":
			m, ok := v.(map[string]any)
			if !ok && v != nil {
				return nil, fmt.Errorf("status is %s, not an object", describe(v))
			}
			resp.Status = m
		case "resyncAfterSeconds":
			s, ok := seconds(v)
			if !ok {
				return nil, fmt.Errorf("resyncAfterSeconds is %s, not a number of seconds from 0 to a day", describe(v))
			}
			resp.ResyncAfter = s
		case "finalized":
			b, ok := v.(bool)
			if !ok {
				return nil, fmt.Errorf("finalized is %s, not a boolean", describe(v))
			}
			resp.Finalized = b
		default:
			return nil, fmt.Errorf("unknown field %q (a sync hook returns status, children, resyncAfterSeconds and finalized)", k)
		}
	}
	return resp, nil
}

// MinResyncAfter is the soonest a rule's function may ask for its trigger
// again (resyncAfterSeconds): a shorter wait is raised to it, so that an
// answer cannot keep a worker reconciling one trigger without pause.
// Metacontroller takes the value as it comes.
const MinResyncAfter = time.Second

// seconds reads resyncAfterSeconds: 0 (not again) up to a day; more than
// 0 is at least MinResyncAfter.
func seconds(v any) (time.Duration, bool) {
	var f float64
	switch n := v.(type) {
	case int64:
		f = float64(n)
	case float64:
		f = n
	case nil:
		return 0, true
	default:
		return 0, false
	}
	switch {
	case math.IsNaN(f) || f < 0 || f > 86400:
		return 0, false
	case f == 0:
		return 0, true
	}
	return max(time.Duration(f*float64(time.Second)), MinResyncAfter), true
}

// objectList reads a function's children: a list of objects, or null.
func objectList(v any) ([]map[string]any, error) {
	list, ok := v.([]any)
	if !ok && v != nil {
		return nil, fmt.Errorf("children is %s, not a list", describe(v))
	}
	children := make([]map[string]any, len(list))
	for i, c := range list {
		if children[i], ok = c.(map[string]any); !ok {
			return nil, fmt.Errorf("children[%d] is %s, not an object", i, describe(c))
		}
	}
	return children, nil
}

// errNotOffline is a webhook called where no cluster is.
var errNotOffline = errors.New("a webhook is called only where the cluster is: offline (render, test), give its response in the test's responses")

// synced keeps what the rule's function said of the trigger.
func (rd *Rendered) synced(resp *SyncResponse) {
	rd.syncStatus = resp.Status
	if rd.syncStatus == nil {
		rd.syncStatus = map[string]any{}
	}
	rd.ResyncAfter = resp.ResyncAfter
	rd.Finalized = resp.Finalized
}

// Recorded is what an offline render is given: objects, and the responses
// a test records for the rule's webhooks.
type Recorded struct {
	Objects
	Responses []RecordedResponse
}

// RecordedResponse is a webhook's response to one rule's resource
// (rules.SyncResourceID for the rule's function) for the triggers that
// match Trigger: its kind and name, and its apiVersion and namespace
// unless empty.
type RecordedResponse struct {
	Rule, Resource string
	Trigger        rules.ObjectRef
	Response       []byte
}

// Response is the first recorded response that matches.
func (rc Recorded) Response(rule, resource string, trigger rules.ObjectRef) ([]byte, bool) {
	for _, r := range rc.Responses {
		if r.Rule == rule && r.Resource == resource && r.Trigger.Matches(trigger) {
			return r.Response, true
		}
	}
	return nil, false
}
