package rules

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/syncloop/syncloop/rules/expr"
)

// AnnotationConversionPrefix starts the annotations in which an object
// keeps, across a conversion, the fields of a version the other cannot
// hold: conversion.syncloop.dev/<version> holds those of <version>, as
// JSON, until the object is converted back to it.
const AnnotationConversionPrefix = "conversion.syncloop.dev/"

// AnnotationConversion, on the CRD of a kind that converts, holds the
// spec.api that defines it (JSON): syncloop converts the kind's objects
// from it when no rule loaded defines the kind — a rule removed, or
// broken since before a restart — for its objects must stay readable.
const AnnotationConversion = Group + "/conversion"

// ConversionOf compiles the kind a CRD's AnnotationConversion defines
// (crd names the CRD, for errors): its versions and conversions.
func ConversionOf(crd string, source []byte) (*API, error) {
	var api any
	if err := json.Unmarshal(source, &api); err != nil {
		return nil, fmt.Errorf("%s: annotation %s: %w", crd, AnnotationConversion, err)
	}
	doc, err := json.Marshal(map[string]any{"apiVersion": APIVersion, "kind": "Rule", "metadata": map[string]any{"name": "conversion"},
		"spec": map[string]any{"api": api, "status": map[string]any{}}})
	if err != nil {
		return nil, err
	}
	l, err := NewLoader(expr.Options{CostLimit: expr.DefaultCostLimit})
	if err != nil {
		return nil, err
	}
	f, err := l.Parse(crd+" ("+AnnotationConversion+")", doc)
	if err != nil {
		return nil, err
	}
	if len(f.Rules) != 1 || f.Rules[0].API == nil {
		return nil, fmt.Errorf("%s: annotation %s defines no kind", crd, AnnotationConversion)
	}
	return f.Rules[0].API, nil
}

// Conversion turns an object of one version of a kind into one of
// another (the hub, or from it): a template of the new
// object's spec over object, the object converted. Fields of the same
// name and shape in both versions that the template does not write are
// copied; status and metadata are kept as they are (the status schema is
// the same in every version: the rule's).
type Conversion struct {
	From, To *Version
	// Pos is where the conversion is written.
	Pos Pos
	// spec renders the new object's spec; nil: copied fields only.
	spec *Template
	// produced are the paths (spec.replicas) the template writes, each
	// with everything below it.
	produced []string
	// lossy are the fields of To the author declared nothing produces.
	lossy []string
}

// Convert returns obj, an object of one of the kind's versions, as an
// object of version to: through the hub when neither is.
// obj is not changed.
func (a *API) Convert(ctx context.Context, obj map[string]any, to string) (map[string]any, error) {
	apiVersion, _ := obj["apiVersion"].(string)
	from := a.VersionNamed(strings.TrimPrefix(apiVersion, a.GVK.Group+"/"))
	if from == nil || apiVersion != a.GVK.Group+"/"+from.Name {
		return nil, fmt.Errorf("%s is not a version of %s", apiVersion, a.CRDName())
	}
	target := a.VersionNamed(to)
	if target == nil {
		return nil, fmt.Errorf("%s has no version %s", a.CRDName(), to)
	}
	if from == target {
		return runtime.DeepCopyJSON(obj), nil
	}
	out := obj
	for _, c := range a.path(from, target) {
		var err error
		if out, err = c.convert(ctx, a, out); err != nil {
			return nil, fmt.Errorf("converting %s %s from %s to %s: %w", a.Kind, nameOf(obj), c.From.Name, c.To.Name, err)
		}
	}
	return out, nil
}

// path is the conversions from one version to another, hub and spoke.
func (a *API) path(from, to *Version) []*Conversion {
	switch {
	case from == to:
		return nil
	case from == a.Hub():
		return []*Conversion{to.FromHub}
	case to == a.Hub():
		return []*Conversion{from.ToHub}
	}
	return []*Conversion{from.ToHub, to.FromHub}
}

func nameOf(obj map[string]any) string {
	md, _ := obj["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	if ns, _ := md["namespace"].(string); ns != "" {
		return ns + "/" + name
	}
	return name
}

// convert converts obj, of c.From, to c.To: metadata and status as they
// are, spec copied and rendered, the fields To cannot hold kept in an
// annotation, and those kept when obj was To before restored.
func (c *Conversion) convert(ctx context.Context, a *API, obj map[string]any) (map[string]any, error) {
	obj = runtime.DeepCopyJSON(obj)
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	src, _ := obj["spec"].(map[string]any)
	spec := carry(src, c.From.Spec, c.To.Spec, "spec", c.produced)
	if c.spec != nil {
		v, err := c.spec.Render(ctx, &expr.Activation{Object: obj})
		if err != nil {
			return nil, err
		}
		rendered, ok := v.(map[string]any)
		if !ok && v != nil {
			return nil, fmt.Errorf("the spec renders as %T, not an object", v)
		}
		for k, v := range rendered {
			spec[k] = merge(spec[k], v)
		}
	}
	annotations, _ := md["annotations"].(map[string]any)
	annotations = maps.Clone(annotations)
	if annotations == nil {
		annotations = map[string]any{}
	}
	if kept, ok := annotations[AnnotationConversionPrefix+c.To.Name].(string); ok {
		var saved map[string]any
		if err := json.Unmarshal([]byte(kept), &saved); err == nil {
			if s, ok := saved["spec"].(map[string]any); ok {
				restore(spec, s)
			}
		}
		delete(annotations, AnnotationConversionPrefix+c.To.Name)
	}
	if back := c.reverse(a); back != nil {
		if held := unheld(src, c.From.Spec, c.To.Spec, "spec", back.produced); len(held) > 0 {
			data, err := json.Marshal(map[string]any{"spec": held})
			if err != nil {
				return nil, err
			}
			annotations[AnnotationConversionPrefix+c.From.Name] = string(data)
		}
	}
	if len(annotations) > 0 {
		md["annotations"] = annotations
	} else {
		delete(md, "annotations")
	}
	obj["metadata"] = md
	obj["apiVersion"] = a.GVK.Group + "/" + c.To.Name
	obj["spec"] = spec
	return obj, nil
}

// reverse is the conversion back from c.To to c.From.
func (c *Conversion) reverse(a *API) *Conversion {
	if c.To == a.Hub() {
		return c.From.FromHub
	}
	return c.To.ToHub
}

// produces reports whether a conversion writes path or a field above it.
func produces(produced []string, path string) bool {
	return slices.ContainsFunc(produced, func(p string) bool { return p == path || strings.HasPrefix(path, p+".") })
}

// carry copies the fields of src (schema from, at path) that the schema
// to has with the same shape and that are not produced.
func carry(src map[string]any, from, to *spec.Schema, path string, produced []string) map[string]any {
	out := map[string]any{}
	for name, ts := range to.Properties {
		p := path + "." + name
		v, ok := src[name]
		fs, inFrom := from.Properties[name]
		if !ok || !inFrom || produces(produced, p) {
			continue
		}
		switch {
		case sameShape(&fs, &ts):
			out[name] = runtime.DeepCopyJSONValue(v)
		case hasFields(&fs) && hasFields(&ts):
			if m, ok := v.(map[string]any); ok {
				if inner := carry(m, &fs, &ts, p, produced); len(inner) > 0 {
					out[name] = inner
				}
			}
		}
	}
	return out
}

// unheld are the fields of src (schema from, at path) that a conversion
// to the schema to cannot hold: those neither copied into it nor
// produced by the conversion back (produced), which would otherwise be
// lost on the way there and back.
func unheld(src map[string]any, from, to *spec.Schema, path string, produced []string) map[string]any {
	out := map[string]any{}
	for name, v := range src {
		p := path + "." + name
		fs, inFrom := from.Properties[name]
		ts, inTo := to.Properties[name]
		switch {
		case produces(produced, p), inFrom && inTo && sameShape(&fs, &ts):
		case inFrom && inTo && hasFields(&fs) && hasFields(&ts):
			if m, ok := v.(map[string]any); ok {
				if inner := unheld(m, &fs, &ts, p, produced); len(inner) > 0 {
					out[name] = inner
				}
			}
		default:
			out[name] = runtime.DeepCopyJSONValue(v)
		}
	}
	return out
}

// restore sets the fields of saved that spec lacks.
func restore(spec, saved map[string]any) {
	for k, v := range saved {
		cur, ok := spec[k]
		switch {
		case !ok:
			spec[k] = v
		default:
			cm, ok1 := cur.(map[string]any)
			sm, ok2 := v.(map[string]any)
			if ok1 && ok2 {
				restore(cm, sm)
			}
		}
	}
}

// merge is v over base: objects field by field, anything else v.
func merge(base, v any) any {
	bm, ok1 := base.(map[string]any)
	vm, ok2 := v.(map[string]any)
	if !ok1 || !ok2 {
		return v
	}
	for k, e := range vm {
		bm[k] = merge(bm[k], e)
	}
	return bm
}

// hasFields reports whether s is an object of named fields.
func hasFields(s *spec.Schema) bool {
	return len(s.Type) > 0 && s.Type[0] == "object" && len(s.Properties) > 0
}

// sameShape reports whether every value of schema a is one of b and the
// other way round, as far as types go: what copies unchanged.
func sameShape(a, b *spec.Schema) bool {
	if schemaKind(a) != schemaKind(b) {
		return false
	}
	if hasFields(a) {
		if len(a.Properties) != len(b.Properties) {
			return false
		}
		for name, as := range a.Properties {
			bs, ok := b.Properties[name]
			if !ok || !sameShape(&as, &bs) {
				return false
			}
		}
	}
	if a.Items != nil && a.Items.Schema != nil && b.Items != nil && b.Items.Schema != nil {
		return sameShape(a.Items.Schema, b.Items.Schema)
	}
	if a.AdditionalProperties != nil && a.AdditionalProperties.Schema != nil && b.AdditionalProperties != nil && b.AdditionalProperties.Schema != nil {
		return sameShape(a.AdditionalProperties.Schema, b.AdditionalProperties.Schema)
	}
	return true
}
