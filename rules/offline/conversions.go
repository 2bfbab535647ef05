package offline

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
)

// apiOf is the kind, defined in several versions by a rule of set, that
// an object of apiVersion and kind is; nil when none is.
func apiOf(set *rules.Set, apiVersion, kind string) *rules.API {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil
	}
	for _, r := range set.Rules() {
		if a := r.API; a != nil && a.Converts() && a.GVK.Group == gv.Group && a.Kind == kind && a.VersionNamed(gv.Version) != nil {
			return a
		}
	}
	return nil
}

// checkConversions checks the test's conversion cases, and that every
// object of a kind of several versions comes back unchanged from every
// other version (its version's defaults applied first, as the API server
// stores it).
func checkConversions(ctx context.Context, t *rules.Test, set *rules.Set, objs []*unstructured.Unstructured) []string {
	var out []string
	for _, c := range t.Conversions {
		apiVersion, _ := c.Object["apiVersion"].(string)
		kind, _ := c.Object["kind"].(string)
		a := apiOf(set, apiVersion, kind)
		if a == nil {
			out = append(out, fmt.Sprintf("%s: no rule defines %s %s in several versions", c.Field, apiVersion, kind))
			continue
		}
		to, _ := c.Expect["apiVersion"].(string)
		gv, _ := schema.ParseGroupVersion(to)
		got, err := a.Convert(ctx, c.Object, gv.Version)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", c.Field, err))
			continue
		}
		for _, d := range subsetDiff(c.Expect, got, "", false) {
			out = append(out, fmt.Sprintf("%s (%s %s to %s): %s", c.Field, kind, apiVersion, gv.Version, d))
		}
	}
	for _, o := range objs {
		a := apiOf(set, o.GetAPIVersion(), o.GetKind())
		if a == nil {
			continue
		}
		out = append(out, roundTrips(ctx, a, o.Object)...)
	}
	return out
}

// roundTrips checks that obj comes back unchanged from every other
// version of a.
func roundTrips(ctx context.Context, a *rules.API, obj map[string]any) []string {
	obj = runtime.DeepCopyJSON(obj)
	from := strings.TrimPrefix(obj["apiVersion"].(string), a.GVK.Group+"/")
	a.VersionNamed(from).Default(obj)
	u := &unstructured.Unstructured{Object: obj}
	name := fmt.Sprintf("%s %s (%s)", a.Kind, strings.TrimPrefix(u.GetNamespace()+"/"+u.GetName(), "/"), from)
	var out []string
	for _, v := range a.Versions {
		if v.Name == from {
			continue
		}
		there, err := a.Convert(ctx, obj, v.Name)
		if err != nil {
			out = append(out, fmt.Sprintf("round trip of %s through %s: %v", name, v.Name, err))
			continue
		}
		back, err := a.Convert(ctx, there, from)
		if err != nil {
			out = append(out, fmt.Sprintf("round trip of %s through %s: back: %v", name, v.Name, err))
			continue
		}
		if !reflect.DeepEqual(normal(back), normal(obj)) {
			out = append(out, fmt.Sprintf("round trip of %s through %s changes it: %s, came back %s", name, v.Name, js(obj["spec"]), js(back["spec"])))
		}
	}
	return out
}

// normal is v as JSON decodes it: numbers of one type.
func normal(v any) any {
	var out any
	_ = json.Unmarshal([]byte(js(v)), &out)
	return out
}

func js(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
