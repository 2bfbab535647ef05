package rules

import (
	"fmt"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// TestKind is the kind of test documents (`syncloop test`).
const TestKind = "Test"

// Test is one `kind: Test` document: rules, the objects they run against
// offline, and what must come of them.
type Test struct {
	Name string
	Pos  Pos
	// Rules and Objects are paths, resolved against the test file's
	// directory.
	Rules   []string
	Objects []string
	Expect  []*Expectation
	// Conversions are conversions between the versions of a kind.
	Conversions []*ConversionCase
	// Responses are what the rules' webhooks answer, offline.
	Responses []*Response
}

// Response is a webhook's recorded response: what the function of a
// rule's resource answers for a trigger.
type Response struct {
	Rule, Resource string
	Trigger        ObjectRef
	Body           map[string]any
}

// ConversionCase is an object in one version of a kind a rule defines,
// and what it must be in another.
type ConversionCase struct {
	Pos   Pos
	Field string // conversions[i]
	// Object is converted to the version of Expect's apiVersion; Expect
	// must match the result as a subset.
	Object, Expect map[string]any
}

// Expectation is what one rule must make of one trigger.
type Expectation struct {
	Pos     Pos
	Field   string // expect[i]
	Rule    string
	Trigger ObjectRef // Kind and Name required; APIVersion, Namespace match any when empty
	// Children must each be rendered: a partial object whose fields must
	// all match (maps as subsets, lists and scalars exactly).
	Children []map[string]any
	// Clusters are the children each named cluster must get, as Children
	// (an empty list: none there).
	Clusters map[string][]map[string]any
	// Absent must not be rendered (Kind and Name; APIVersion, Namespace
	// match any when empty).
	Absent []ObjectRef
	// Conflicts must each be a child not applied for a conflict (Kind and
	// Name; APIVersion, Namespace match any when empty); a conflict not
	// listed fails the test.
	Conflicts []ObjectRef
	// Status, when not nil, must match the rendered status as a subset.
	Status map[string]any
	// Skipped, when not nil, is whether `when` is false for the trigger.
	Skipped *bool
	// Error, when not empty, must be in the message of the render's
	// failure; when empty, the render must not fail.
	Error string
}

// IsTestDocument reports whether a decoded YAML document is a Test.
func isTestDocument(root *yaml.Node) bool {
	root = resolve(root)
	if root.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if resolve(root.Content[i]).Value == "kind" {
			return resolve(root.Content[i+1]).Value == TestKind
		}
	}
	return false
}

// ParseTests decodes the Test documents in data (other documents are
// skipped), strictly: an unknown field, a missing one or a value of the
// wrong type is an error with its file:line:col. path names the file and is
// what rules and objects are resolved against.
func ParseTests(path string, data []byte) ([]*Test, error) {
	if len(data) > maxFileSize {
		return nil, ErrorList{{Pos: Pos{File: path}, Msg: fmt.Sprintf("file too large: %d bytes, the limit is %d", len(data), maxFileSize)}}
	}
	var tests []*Test
	var errs ErrorList
	names := map[string]Pos{}
	lines := strings.Split(string(data), "\n")
	if err := eachDocument(path, data, func(root *yaml.Node) {
		if !isTestDocument(root) {
			return
		}
		d := &decoder{file: path, lines: lines}
		t := d.decodeTest(root, filepath.Dir(path))
		errs = append(errs, d.errs...)
		if t == nil || len(d.errs) > 0 {
			return
		}
		if prev, dup := names[t.Name]; dup {
			errs = append(errs, &Error{Pos: t.Pos, Field: "metadata.name", Msg: fmt.Sprintf("test name used twice: also at %s", prev)})
			return
		}
		names[t.Name] = t.Pos
		tests = append(tests, t)
	}); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return tests, nil
}

func (d *decoder) decodeTest(root *yaml.Node, dir string) *Test {
	f := d.fields(root, "", TestFormat.known("")...)
	if f == nil {
		return nil
	}
	t := &Test{Pos: d.pos(resolve(root))}
	if n, ok := f["apiVersion"]; !ok {
		d.errorf(root, "apiVersion", "required: %s", APIVersion)
	} else if v, ok := d.str(n, "apiVersion"); ok && v != APIVersion {
		d.errorf(n, "apiVersion", "must be %s, not %q", APIVersion, v)
	}
	if n, ok := f["metadata"]; !ok {
		d.errorf(root, "metadata.name", "required")
	} else if md := d.fields(n, "metadata", TestFormat.known("metadata")...); md != nil {
		if nn, ok := md["name"]; !ok {
			d.errorf(n, "metadata.name", "required")
		} else if v, ok := d.str(nn, "metadata.name"); ok && v != "" {
			t.Name = v
		} else if ok {
			d.errorf(nn, "metadata.name", "must not be empty")
		}
	}
	paths := func(field string) []string {
		n, ok := f[field]
		if !ok {
			d.errorf(root, field, "required: the %s files or directories, relative to this file", field)
			return nil
		}
		var out []string
		for i, pn := range d.seq(n, field) {
			if v, ok := d.str(pn, fmt.Sprintf("%s[%d]", field, i)); ok {
				if !filepath.IsAbs(v) {
					v = filepath.Join(dir, v)
				}
				out = append(out, v)
			}
		}
		return out
	}
	t.Rules = paths("rules")
	t.Objects = paths("objects")
	if cn, ok := f["conversions"]; ok {
		for i, c := range d.seq(cn, "conversions") {
			if cc := d.decodeConversionCase(c, fmt.Sprintf("conversions[%d]", i)); cc != nil {
				t.Conversions = append(t.Conversions, cc)
			}
		}
	}
	if rn, ok := f["responses"]; ok {
		for i, r := range d.seq(rn, "responses") {
			if resp := d.decodeResponse(r, fmt.Sprintf("responses[%d]", i)); resp != nil {
				t.Responses = append(t.Responses, resp)
			}
		}
	}
	n, ok := f["expect"]
	if !ok {
		if _, ok := f["conversions"]; !ok {
			d.errorf(root, "expect", "required: what the rules must render")
		}
		return t
	}
	for i, en := range d.seq(n, "expect") {
		if e := d.decodeExpectation(en, fmt.Sprintf("expect[%d]", i)); e != nil {
			t.Expect = append(t.Expect, e)
		}
	}
	if len(t.Expect) == 0 && len(d.errs) == 0 {
		d.errorf(n, "expect", "must list at least one expectation")
	}
	return t
}

// decodeConversionCase decodes one of a test's conversions.
func (d *decoder) decodeConversionCase(n *yaml.Node, field string) *ConversionCase {
	f := d.fields(n, field, TestFormat.known("conversions")...)
	if f == nil {
		return nil
	}
	c := &ConversionCase{Pos: d.pos(resolve(n)), Field: field}
	for key, to := range map[string]*map[string]any{"object": &c.Object, "expect": &c.Expect} {
		vn, ok := f[key]
		if !ok {
			d.errorf(n, field+"."+key, "required: an object with apiVersion and kind")
			continue
		}
		v, ok := d.value(vn, nil, field+"."+key, positions{})
		m, isMap := v.(map[string]any)
		switch {
		case !ok:
		case !isMap:
			d.errorf(vn, field+"."+key, "must be a mapping: an object")
		case m["apiVersion"] == nil || m["kind"] == nil:
			d.errorf(vn, field+"."+key, "apiVersion and kind are required")
		default:
			*to = m
		}
	}
	return c
}

// decodeResponse decodes one of a test's recorded webhook responses.
func (d *decoder) decodeResponse(n *yaml.Node, field string) *Response {
	f := d.fields(n, field, TestFormat.known("responses")...)
	if f == nil {
		return nil
	}
	r := &Response{Resource: SyncResourceID}
	if rn, ok := f["rule"]; ok {
		r.Rule, _ = d.str(rn, field+".rule")
	} else {
		d.errorf(n, field+".rule", "required")
	}
	if rn, ok := f["resource"]; ok {
		r.Resource, _ = d.str(rn, field+".resource")
	}
	if tn, ok := f["trigger"]; ok {
		r.Trigger = d.objectRef(tn, field+".trigger")
	} else {
		d.errorf(n, field+".trigger", "required: {kind, name}, apiVersion and namespace optional")
	}
	vn, ok := f["response"]
	if !ok {
		d.errorf(n, field+".response", "required: the response body")
		return nil
	}
	v, ok := d.value(vn, nil, field+".response", positions{})
	m, isMap := v.(map[string]any)
	switch {
	case !ok:
		return nil
	case !isMap:
		d.errorf(vn, field+".response", "must be a mapping: the response body")
		return nil
	}
	r.Body = m
	return r
}

func (d *decoder) decodeExpectation(n *yaml.Node, field string) *Expectation {
	f := d.fields(n, field, TestFormat.known("expect")...)
	if f == nil {
		return nil
	}
	e := &Expectation{Pos: d.pos(resolve(n)), Field: field}
	if rn, ok := f["rule"]; !ok {
		d.errorf(n, field+".rule", "required")
	} else {
		e.Rule, _ = d.str(rn, field+".rule")
	}
	if tn, ok := f["trigger"]; !ok {
		d.errorf(n, field+".trigger", "required: {kind, name}, apiVersion and namespace optional")
	} else {
		e.Trigger = d.objectRef(tn, field+".trigger")
	}
	if cn, ok := f["children"]; ok {
		e.Children = d.partialObjects(cn, field+".children")
	}
	if cn, ok := f["clusters"]; ok {
		e.Clusters = map[string][]map[string]any{}
		if m := resolve(cn); m.Kind != yaml.MappingNode {
			d.errorf(cn, field+".clusters", "must be a mapping: the children wanted in each cluster, by its name")
		} else {
			for i := 0; i+1 < len(m.Content); i += 2 {
				name := m.Content[i].Value
				e.Clusters[name] = nonNilMaps(d.partialObjects(m.Content[i+1], field+".clusters."+name))
			}
		}
	}
	if an, ok := f["absent"]; ok {
		for i, a := range d.seq(an, field+".absent") {
			e.Absent = append(e.Absent, d.objectRef(a, fmt.Sprintf("%s.absent[%d]", field, i)))
		}
	}
	if cn, ok := f["conflicts"]; ok {
		for i, a := range d.seq(cn, field+".conflicts") {
			e.Conflicts = append(e.Conflicts, d.objectRef(a, fmt.Sprintf("%s.conflicts[%d]", field, i)))
		}
	}
	if sn, ok := f["status"]; ok {
		v, ok := d.value(sn, nil, field+".status", positions{})
		if m, isMap := v.(map[string]any); ok && isMap {
			e.Status = m
		} else if ok {
			d.errorf(sn, field+".status", "must be a mapping: a partial status")
		}
	}
	if sn, ok := f["skipped"]; ok {
		if b, ok := d.boolean(sn, field+".skipped"); ok {
			e.Skipped = &b
		}
	}
	if en, ok := f["error"]; ok {
		if v, ok := d.str(en, field+".error"); ok && v != "" {
			e.Error = v
		} else if ok {
			d.errorf(en, field+".error", "must not be empty")
		}
	}
	return e
}

// objectRef decodes {apiVersion?, kind, namespace?, name}.
func (d *decoder) objectRef(n *yaml.Node, field string) ObjectRef {
	var r ObjectRef
	f := d.fields(n, field, TestFormat.known("expect.trigger")...)
	if f == nil {
		return r
	}
	for key, to := range map[string]*string{"apiVersion": &r.APIVersion, "kind": &r.Kind, "namespace": &r.Namespace, "name": &r.Name} {
		if vn, ok := f[key]; ok {
			*to, _ = d.str(vn, field+"."+key)
		} else if key == "kind" || key == "name" {
			d.errorf(n, field+"."+key, "required")
		}
	}
	return r
}

// Matches reports whether obj is what r names: kind and name, and
// apiVersion and namespace when r sets them.
func (r ObjectRef) Matches(obj ObjectRef) bool {
	return r.Kind == obj.Kind && r.Name == obj.Name &&
		(r.APIVersion == "" || r.APIVersion == obj.APIVersion) &&
		(r.Namespace == "" || r.Namespace == obj.Namespace)
}

// partialObjects decodes a list of partial objects, each with a kind and
// a metadata.name.
func (d *decoder) partialObjects(n *yaml.Node, field string) []map[string]any {
	var out []map[string]any
	for i, c := range d.seq(n, field) {
		cf := fmt.Sprintf("%s[%d]", field, i)
		v, ok := d.value(c, nil, cf, positions{})
		m, isMap := v.(map[string]any)
		switch {
		case !ok:
		case !isMap:
			d.errorf(c, cf, "must be a mapping: a partial object")
		default:
			if k, _ := m["kind"].(string); k == "" {
				d.errorf(c, cf, "kind is required")
			}
			if md, _ := m["metadata"].(map[string]any); md == nil || md["name"] == nil {
				d.errorf(c, cf, "metadata.name is required")
			}
			out = append(out, m)
		}
	}
	return out
}

func nonNilMaps(l []map[string]any) []map[string]any {
	if l == nil {
		return []map[string]any{}
	}
	return l
}
