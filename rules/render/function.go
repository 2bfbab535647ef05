package render

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/rules"
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

// decodeOutput reads what a function writes on stdout, as JSON:
// {"children": [objects]} and nothing else, numbers as the API machinery
// has them (integers int64) — decoded once, for all its children.
func decodeOutput(stdout []byte) ([]map[string]any, error) {
	var out map[string]any
	if err := utiljson.Unmarshal(stdout, &out); err != nil {
		return nil, err
	}
	for k := range out {
		if k != "children" {
			return nil, fmt.Errorf("unknown field %q", k)
		}
	}
	list, ok := out["children"].([]any)
	if !ok && out["children"] != nil {
		return nil, fmt.Errorf("children is %T, not a list", out["children"])
	}
	children := make([]map[string]any, len(list))
	for i, c := range list {
		if children[i], ok = c.(map[string]any); !ok {
			return nil, fmt.Errorf("children[%d] is %T, not an object", i, c)
		}
	}
	return children, nil
}

// callFunction calls res's function for the render so far and returns the
// objects it made, checked as children of res.
func (w *graphWalk) callFunction(ctx context.Context, res *rules.Resource, namespaced bool) ([]*unstructured.Unstructured, error) {
	fn := res.Function
	if fn.Module == nil {
		return nil, childError(w.r, res, "", fmt.Errorf("module %s (sha256 %.12s) is not loaded in this process: give the rule files (-f) to run it", fn.Wasm, fn.Digest))
	}
	in := FunctionInput{Rule: w.r.Name, Resource: res.ID, Object: w.trigger.Object, Variables: w.rd.act.Variables, Lookups: w.rd.act.Lookups}
	if len(fn.Reads) > 0 {
		in.Children = make(map[string]any, len(fn.Reads))
		for _, id := range fn.Reads {
			if c, ok := w.rd.children[id]; ok {
				in.Children[id] = c
			}
		}
	}
	data, err := json.Marshal(in)
	if err != nil {
		return nil, childError(w.r, res, "", fmt.Errorf("its input: %w", err))
	}
	call := fn.Module.Call
	if fn.Serve {
		call = fn.Module.Serve
	}
	res1, err := call(ctx, data, fn.Limits)
	logger := klog.FromContext(ctx).WithValues("rule", w.r.Name, "resource", res.ID, "module", fn.Wasm)
	if len(res1.Stderr) > 0 {
		logger.V(2).Info("Function stderr", "stderr", string(res1.Stderr))
	}
	if err != nil {
		if ce, ok := errors.AsType[*function.CallError](err); ok && len(ce.Stderr) > 0 {
			logger.Info("Function failed", "err", ce.Why, "stderr", string(ce.Stderr))
		}
		return nil, childError(w.r, res, "", fmt.Errorf("module %s: %w", fn.Wasm, err))
	}
	children, err := decodeOutput(res1.Stdout)
	if err != nil {
		return nil, childError(w.r, res, "", fmt.Errorf("module %s wrote no {\"children\": [objects]} on stdout: %v", fn.Wasm, err))
	}
	if n := len(w.rd.Children) + len(children); n > MaxChildren {
		return nil, childError(w.r, res, "", fmt.Errorf("%d children, more than the %d one trigger may have", n, MaxChildren))
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

// functionChild makes object i a function returned a child of res.
func (w *graphWalk) functionChild(res *rules.Resource, i int, m map[string]any, namespaced bool) (*unstructured.Unstructured, error) {
	field := fmt.Sprintf("children[%d]", i)
	obj := &unstructured.Unstructured{Object: m}
	if err := checkKind(w.r, res, obj); err != nil {
		return nil, err
	}
	md, ok := m["metadata"].(map[string]any)
	if !ok {
		return nil, childError(w.r, res, field+".metadata", errors.New("must be a mapping with a name"))
	}
	for _, key := range []string{"generateName", "ownerReferences"} {
		if _, set := md[key]; set {
			return nil, childError(w.r, res, field+".metadata."+key, errors.New("not supported: syncloop names its children and sets their owner"))
		}
	}
	triggerNamespaced := w.trigger.GetNamespace() != ""
	if err := placeChild(w.r, res, obj, md, w.trigger, triggerNamespaced, namespaced); err != nil {
		return nil, err
	}
	if err := markChild(w.r, res, obj, md, w.trigger, triggerNamespaced, namespaced); err != nil {
		return nil, err
	}
	return obj, nil
}
