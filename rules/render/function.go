package render

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/function"
)

// A function step: the resource's module is called with what a template
// would see, and each object it returns becomes a child exactly as a
// rendered template does — its kind checked against the resource's kinds,
// its name and namespace placed, syncloop's marks put on.

// FunctionInput is what a function reads on stdin, as JSON.
type FunctionInput struct {
	Rule     string `json:"rule"`
	Resource string `json:"resource"`
	// Object is the trigger.
	Object    map[string]any `json:"object"`
	Variables map[string]any `json:"variables,omitempty"`
	Lookups   map[string]any `json:"lookups,omitempty"`
	// Children are the children of the resources the function reads,
	// by id: an object, or a list for a forEach or function resource.
	Children map[string]any `json:"children,omitempty"`
}

// decodeOutput reads what a resource's function writes on stdout, as
// JSON: {"children": [objects]} and nothing else, numbers as the API
// machinery has them (integers int64) — decoded once, for all its
// children, once b is charged for it (decodeJSON).
func decodeOutput(stdout []byte, b *expr.Budget) ([]map[string]any, error) {
	var out map[string]any
	if err := decodeJSON(stdout, b, &out); err != nil {
		return nil, err
	}
	for k := range out {
		if k != "children" {
			return nil, fmt.Errorf("unknown field %q", k)
		}
	}
	return objectList(out["children"])
}

// CallObserver is told of each function call: how long it took and how
// it ended (the engine's metrics).
type CallObserver interface {
	FunctionCalled(res *rules.Resource, fn *rules.Function, took time.Duration, err error)
}

// callFunction calls res's function for the render so far and returns the
// objects it made, checked as children of res. The rule's function also
// says the trigger's status and when to call it again (w.rd.synced).
func (w *graphWalk) callFunction(ctx context.Context, res *rules.Resource, namespaced bool) ([]*unstructured.Unstructured, error) {
	fn := res.Function
	var in any
	if fn.Sync {
		finalizing := w.in.Finalizing && fn.Finalize != nil
		if finalizing {
			fn = fn.Finalize
		}
		req, err := w.syncRequest(ctx, res, finalizing)
		if err != nil {
			return nil, childError(w.in.Rule, res, "", err)
		}
		in = req
	} else {
		in = w.functionInput(res)
	}
	data, err := json.Marshal(in)
	if err != nil {
		return nil, childError(w.in.Rule, res, "", fmt.Errorf("its input: %w", err))
	}
	out, err := w.call(ctx, res, fn, data)
	if err != nil {
		return nil, childError(w.in.Rule, res, "", fmt.Errorf("%s: %w", fn.Name(), err))
	}
	var children []map[string]any
	if fn.Sync {
		var resp *SyncResponse
		if resp, err = decodeSyncResponse(out, w.rd.act.Budget); err == nil {
			w.rd.synced(resp)
			children = resp.Children
		}
	} else {
		children, err = decodeOutput(out, w.rd.act.Budget)
	}
	if errors.Is(err, expr.ErrTooLarge) {
		return nil, childError(w.in.Rule, res, "", fmt.Errorf("%s: its answer: %w", fn.Name(), err))
	}
	if err != nil {
		want := `{"children": [objects]}`
		if fn.Sync {
			want = `a sync hook's response ({"status": {…}, "children": [objects]})`
		}
		return nil, childError(w.in.Rule, res, "", fmt.Errorf("%s returned no %s: %v", fn.Name(), want, err))
	}
	if n := len(w.rd.Children) + len(children); n > MaxChildren {
		return nil, childError(w.in.Rule, res, "", fmt.Errorf("%d children, more than the %d one trigger may have", n, MaxChildren))
	}
	objs := make([]*unstructured.Unstructured, 0, len(children))
	for i, c := range children {
		obj, err := w.functionChild(res, i, c, namespaced)
		if err != nil {
			return nil, err
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// functionInput is the input of a resource's function.
func (w *graphWalk) functionInput(res *rules.Resource) *FunctionInput {
	in := &FunctionInput{Rule: w.in.Rule.Name, Resource: res.ID, Object: w.in.Trigger.Object, Variables: w.rd.act.Variables, Lookups: w.rd.act.Lookups}
	if reads := res.Function.Reads; len(reads) > 0 {
		in.Children = make(map[string]any, len(reads))
		for _, id := range reads {
			if c, ok := w.rd.children[id]; ok {
				in.Children[id] = c
			}
		}
	}
	return in
}

// call calls res's function with data and returns what it wrote: a
// webhook offline answers with the response recorded for it, if any.
func (w *graphWalk) call(ctx context.Context, res *rules.Resource, fn *rules.Function, data []byte) ([]byte, error) {
	if fn.Webhook != nil && w.offline {
		if out, ok := w.in.Recorded.Response(w.in.Rule.Name, fn.CallID(res), rules.RefOf(w.in.Trigger)); ok {
			return out, nil
		}
		return nil, errNotOffline
	}
	start := time.Now()
	out, err := fn.Call(ctx, data)
	if w.in.Calls != nil {
		w.in.Calls.FunctionCalled(res, fn, time.Since(start), err)
	}
	logger := klog.FromContext(ctx).WithValues("rule", w.in.Rule.Name, "resource", fn.CallID(res), "function", fn.Name())
	if len(out.Stderr) > 0 && err == nil {
		logger.V(2).Info("Function stderr", "stderr", string(out.Stderr))
	}
	if ce, ok := errors.AsType[*function.CallError](err); ok && len(ce.Stderr) > 0 {
		logger.Info("Function failed", "err", ce.Why, "stderr", string(ce.Stderr))
	}
	return out.Stdout, err
}

// functionChild makes object i a function returned a child of res.
func (w *graphWalk) functionChild(res *rules.Resource, i int, m map[string]any, namespaced bool) (*unstructured.Unstructured, error) {
	field := fmt.Sprintf("children[%d]", i)
	obj := &unstructured.Unstructured{Object: m}
	if err := checkKind(w.in.Rule, res, obj); err != nil {
		return nil, childError(w.in.Rule, res, field+".kind", fmt.Errorf("%s returned apiVersion %s, kind %s: not among the kinds listed (%s)",
			res.Function.Name(), describe(m["apiVersion"]), describe(m["kind"]), res.KindNames()))
	}
	md, ok := m["metadata"].(map[string]any)
	if !ok {
		return nil, childError(w.in.Rule, res, field+".metadata", errors.New("must be a mapping with a name"))
	}
	for _, key := range []string{"generateName", "ownerReferences"} {
		if _, set := md[key]; set {
			return nil, childError(w.in.Rule, res, field+".metadata."+key, errors.New("not supported: syncloop names its children and sets their owner"))
		}
	}
	triggerNamespaced := w.in.Trigger.GetNamespace() != ""
	if err := placeChild(w.in.Rule, res, obj, md, w.in.Trigger, triggerNamespaced, namespaced); err != nil {
		return nil, err
	}
	if err := markChild(w.in.Rule, res, obj, md, w.in.Trigger, triggerNamespaced, namespaced); err != nil {
		return nil, err
	}
	return obj, nil
}
