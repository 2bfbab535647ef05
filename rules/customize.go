package rules

import (
	"go.yaml.in/yaml/v3"

	"github.com/syncloop/syncloop/rules/function"
)

// A rule function's customize function is Metacontroller's customize
// hook: called with the trigger, it says which objects the rule's
// function is given as related — by kind, namespace, names or labels.
// The kinds it may name are listed in the rule, so that RBAC, the chart
// and the informers know them: each is a lookup of the rule (Related) that
// only the customize function's answers read. Its answer for a trigger
// is kept until the trigger changes.

// RelatedLookupPrefix starts the id of a lookup a customize function
// reads: no lookup of spec.lookups can have it.
const RelatedLookupPrefix = "customize:"

// maxMemo and maxMemoBytes bound the answers one customize function
// keeps, one per trigger: an answer may be as long as a call's output
// (function.DefaultLimits), and 100,000 of those would not fit anywhere.
const (
	maxMemo      = 100_000
	maxMemoBytes = 64 << 20
)

// decodeCustomize decodes a rule function's customize function (n, at
// field), with the kinds it may relate.
func (d *decoder) decodeCustomize(n *yaml.Node, field string, docPath []any, docVal any) *Function {
	f := d.fields(n, field, RuleFormat.known(field)...)
	if f == nil {
		return nil
	}
	kn, ok := f["kinds"]
	if !ok {
		d.errorf(n, field+".kinds", "required: list every kind the customize function may name ({apiVersion, kind} each); it fails the trigger on any other")
		return nil
	}
	kinds := d.kindList(kn, field)
	fn := d.function(n, f, field, docPath, docVal)
	if fn == nil || len(kinds) == 0 {
		return nil
	}
	fn.Hook, fn.Memo = "customize", function.NewMemo(maxMemo, maxMemoBytes)
	for _, k := range kinds {
		fn.Related = append(fn.Related, &Lookup{ID: RelatedLookupPrefix + k.Kind + "." + k.APIVersion, KindRef: k,
			Related: true, Pos: fn.Pos, Field: field + ".kinds"})
	}
	return fn
}

// addRelatedLookups makes the kinds res's customize function may relate
// lookups of r, after those of spec.lookups.
func (r *Rule) addRelatedLookups(res *Resource) {
	if res.Function == nil || res.Function.Customize == nil {
		return
	}
	for _, l := range res.Function.Customize.Related {
		l.Index = len(r.Lookups)
		r.Lookups = append(r.Lookups, l)
	}
}
