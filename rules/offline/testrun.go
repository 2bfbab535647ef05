package offline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
	"github.com/syncloop/syncloop/rules/render"
)

// RunTest loads t's rules (typed by the CRDs among its objects too) and
// objects, renders the rules against the objects as `syncloop render`
// does — the objects are the cluster: triggers, lookup targets, and live
// children — and checks every expectation. failures are what did not
// match, one readable line each; err is a file that does not load. With
// tenant, the rules are the tenant rules of that namespace
// (rules.Loader.ForTenant), and the test names them as their files do.
func RunTest(ctx context.Context, opts expr.Options, t *rules.Test, tenant string) (failures []string, err error) {
	objs, err := rules.ReadObjects(t.Objects...)
	if err != nil {
		return nil, err
	}
	l, err := rules.NewLoader(opts)
	if err != nil {
		return nil, err
	}
	if tenant != "" {
		if l, err = l.ForTenant(tenant); err != nil {
			return nil, err
		}
	}
	l.UseCRDs(objs)
	set, err := l.Load(t.Rules...)
	if err != nil {
		return nil, err
	}
	responses, err := Responses(t, tenant)
	if err != nil {
		return nil, err
	}
	res, err := Render(ctx, set, objs, "", responses...)
	if err != nil {
		return nil, err
	}
	for _, e := range t.Expect {
		if tenant != "" {
			named := *e
			named.Rule = rules.TenantName(tenant, e.Rule)
			e = &named
		}
		failures = append(failures, check(e, set, res)...)
	}
	failures = append(failures, checkConversions(ctx, t, set, objs)...)
	return failures, nil
}

// Responses are the webhook responses t records, as the render takes
// them (the rules named as tenant's, if set).
func Responses(t *rules.Test, tenant string) ([]render.RecordedResponse, error) {
	var out []render.RecordedResponse
	for _, r := range t.Responses {
		body, err := json.Marshal(r.Body)
		if err != nil {
			return nil, err
		}
		rule := r.Rule
		if tenant != "" {
			rule = rules.TenantName(tenant, rule)
		}
		out = append(out, render.RecordedResponse{Rule: rule, Resource: r.Resource, Trigger: r.Trigger, Response: body})
	}
	return out, nil
}

// check checks one expectation against the report of the render, and
// returns what did not match.
func check(e *rules.Expectation, set *rules.Set, res *Report) []string {
	fail := func(format string, args ...any) string {
		return fmt.Sprintf("%s (rule %s, trigger %s): %s", e.Field, e.Rule, e.Trigger.String(), fmt.Sprintf(format, args...))
	}
	if set.Get(e.Rule) == nil {
		names := make([]string, 0, set.Len())
		for _, r := range set.Rules() {
			names = append(names, r.Name)
		}
		return []string{fail("no such rule (rules: %s)", strings.Join(names, ", "))}
	}
	var r *Result
	for i := range res.Results {
		if res.Results[i].Rule == e.Rule && e.Trigger.Matches(res.Results[i].Trigger) {
			r = &res.Results[i]
			break
		}
	}
	if r == nil {
		return []string{fail("the rule rendered nothing for it: no such object among the objects, or the rule's watch does not match it")}
	}
	switch {
	case e.Error != "" && r.Error == "":
		return []string{fail("want an error containing %q, rendered without one", e.Error)}
	case e.Error != "" && !strings.Contains(r.Error, e.Error):
		return []string{fail("want an error containing %q, got: %s", e.Error, r.Error)}
	case e.Error != "":
		return nil
	case r.Error != "":
		return []string{fail("rendering failed: %s", r.Error)}
	}
	var out []string
	if e.Skipped != nil && *e.Skipped != r.Skipped {
		out = append(out, fail("want skipped: %v (when), rendered skipped: %v", *e.Skipped, r.Skipped))
	}
	out = append(out, checkChildren(e, r, fail)...)
	out = append(out, checkConflicts(e, r, fail)...)
	if e.Status != nil {
		for _, d := range subsetDiff(e.Status, r.Status, "status", false) {
			out = append(out, fail("%s", d))
		}
	}
	return out
}

// checkChildren checks the children an expectation wants rendered (a
// subset of their fields) and those it wants absent.
func checkChildren(e *rules.Expectation, r *Result, fail func(string, ...any) string) []string {
	rendered := append(append([]map[string]any(nil), r.Children...), r.Patches...)
	out := checkRendered(e.Children, rendered, "children", fail)
	for _, cluster := range slices.Sorted(maps.Keys(e.Clusters)) {
		want, got := e.Clusters[cluster], r.childrenIn(cluster)
		field := "clusters." + cluster
		if len(want) == 0 && len(got) > 0 {
			out = append(out, fail("%s: want none there, rendered %s", field, describeAll(got)))
		}
		out = append(out, checkRendered(want, got, field, fail)...)
	}
	for i, a := range e.Absent {
		for _, c := range rendered {
			if a.Matches(refOfMap(c)) {
				out = append(out, fail("absent[%d]: %s rendered", i, refOfMap(c).String()))
			}
		}
	}
	return out
}

// checkRendered checks that each partial object of wants (at field) is
// among rendered.
func checkRendered(wants, rendered []map[string]any, field string, fail func(string, ...any) string) []string {
	var out []string
	for i, want := range wants {
		ref := refOfMap(want)
		var got map[string]any
		for _, c := range rendered {
			if ref.Matches(refOfMap(c)) {
				got = c
				break
			}
		}
		if got == nil {
			out = append(out, fail("%s[%d]: %s not rendered (rendered: %s)", field, i, ref.String(), describeAll(rendered)))
			continue
		}
		secret := ref.Kind == "Secret"
		for _, d := range subsetDiff(want, got, "", secret) {
			out = append(out, fail("%s[%d] %s: %s", field, i, ref.String(), d))
		}
	}
	return out
}

// checkConflicts checks that the conflicts an expectation names are
// conflicts, and that no other is.
func checkConflicts(e *rules.Expectation, r *Result, fail func(string, ...any) string) []string {
	var out []string
	for i, want := range e.Conflicts {
		found := false
		for _, c := range r.Conflicts {
			found = found || want.Matches(c.Object)
		}
		if !found {
			out = append(out, fail("conflicts[%d]: %s is not a conflict", i, want.String()))
		}
	}
	for _, c := range r.Conflicts {
		expected := false
		for _, want := range e.Conflicts {
			expected = expected || want.Matches(c.Object)
		}
		if !expected {
			out = append(out, fail("conflict: %s", c.Message))
		}
	}
	return out
}

// refOfMap is rules.RefOf for a rendered child as render's results hold it.
func refOfMap(m map[string]any) rules.ObjectRef {
	return rules.RefOf(&unstructured.Unstructured{Object: m})
}

func describeAll(objs []map[string]any) string {
	if len(objs) == 0 {
		return "none"
	}
	var s []string
	for _, o := range objs {
		s = append(s, refOfMap(o).String())
	}
	return strings.Join(s, ", ")
}

// subsetDiff says where got does not hold want: every field of a wanted
// map must be there and match; lists match item by item, with the same
// length; scalars are equal (numbers by value). Values of a Secret's data
// and stringData are shown as hashes, as plans show them.
func subsetDiff(want, got any, path string, secret bool) []string {
	show := func(v any) string { return showValue(v, path, secret) }
	at := path
	if at == "" {
		at = "(the object)"
	}
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			if got == nil {
				return []string{fmt.Sprintf("%s: want %s, not rendered", at, show(want))}
			}
			return []string{fmt.Sprintf("%s: want a mapping, rendered %s", at, show(got))}
		}
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var out []string
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			gv, present := g[k]
			if !present {
				out = append(out, fmt.Sprintf("%s: want %s, not rendered", p, showValue(w[k], p, secret)))
				continue
			}
			out = append(out, subsetDiff(w[k], gv, p, secret)...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return []string{fmt.Sprintf("%s: want %s, rendered %s", at, show(want), show(got))}
		}
		var out []string
		for i := range w {
			out = append(out, subsetDiff(w[i], g[i], fmt.Sprintf("%s[%d]", path, i), secret)...)
		}
		return out
	}
	if !scalarEqual(want, got) {
		return []string{fmt.Sprintf("%s: want %s, rendered %s", at, show(want), show(got))}
	}
	return nil
}

// showValue is v as JSON, or a hash for a value of a Secret's data or
// stringData.
func showValue(v any, path string, secret bool) string {
	if secret && (strings.HasPrefix(path, "data.") || strings.HasPrefix(path, "stringData.")) {
		if s, ok := v.(string); ok {
			sum := sha256.Sum256([]byte(s))
			return "(redacted, sha256:" + hex.EncodeToString(sum[:4]) + ")"
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func scalarEqual(a, b any) bool {
	af, aNum := number(a)
	bf, bNum := number(b)
	if aNum && bNum {
		return af == bf
	}
	return reflect.DeepEqual(a, b)
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}
