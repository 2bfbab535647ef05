package dynamic

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
)

// An apply's answer as the API server writes it: metadata first, the
// resourceVersion before the managedFields.
const answer = `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"tenant-t-00001","namespace":"ns","uid":"6d1d3b0e-8b9e-4a47-9d7e-0c1f1f1f1f1f","resourceVersion":"48213","creationTimestamp":"2026-12-02T08:00:00Z","labels":{"app.kubernetes.io/managed-by":"syncloop","syncloop.dev/rule":"tenant-config"},"managedFields":[{"manager":"syncloop/tenant-config","operation":"Apply","apiVersion":"v1","time":"2026-12-02T08:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{"f:tier":{}}}}]},"data":{"tier":"bronze"}}`

func TestAnswerVersion(t *testing.T) {
	for _, c := range []struct{ name, body, want, err string }{
		{"as the server writes it", answer, "48213", ""},
		{"content before metadata", `{"data":{"resourceVersion":"no","x":[1,{"a":"b"}]},"metadata":{"labels":{"resourceVersion":"no"},"resourceVersion":"7"}}`, "7", ""},
		{"no resourceVersion", `{"kind":"ConfigMap","metadata":{"name":"a"},"data":{}}`, "", ""},
		{"no metadata", `{"kind":"ConfigMap"}`, "", ""},
		{"escapes", `{"metadata":{"name":"a\\\"}{[","resourceVersion":"4\u0032"}}`, "42", ""},
		{"spaces", " {\n \"metadata\" : {\t\"uid\" : [ ] , \"resourceVersion\" :\"9\" } } ", "9", ""},
		{"not an object", `[1,2]`, "", "invalid character '['"},
		{"cut short", `{"kind":"ConfigMap","metadata":{"name":`, "", "unexpected end"},
		{"cut in a string", `{"kind":"Config`, "", "unexpected end"},
		{"not JSON", `<html>`, "", "invalid character '<'"},
		{"a number for a version", `{"metadata":{"resourceVersion":7}}`, "", "invalid character '7'"},
	} {
		got, err := answerVersion([]byte(c.body))
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %q, %v; want %q, error containing %q", c.name, got, err, c.want, c.err)
		}
	}
}

// TestAnswerVersionAsDecoded: on objects of every shape encoding/json
// writes — metadata anywhere among the keys, values of every kind nested,
// strings holding quotes, escapes and brackets — the scan finds what
// decoding the whole object finds.
func TestAnswerVersionAsDecoded(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	strs := []string{"", "a", `"`, `\`, "{", "}", "[", "]", ",", ":", "é", "\u2028", "\n", `\"}`, "resourceVersion", "metadata"}
	var value func(depth int) any
	value = func(depth int) any {
		switch k := r.IntN(7); {
		case k == 0 || depth > 3:
			return strs[r.IntN(len(strs))] + strs[r.IntN(len(strs))]
		case k == 1:
			return r.Float64() * 1e6
		case k == 2:
			return r.IntN(2) == 0
		case k == 3:
			return nil
		case k == 4:
			a := make([]any, r.IntN(4))
			for i := range a {
				a[i] = value(depth + 1)
			}
			return a
		default:
			m := map[string]any{}
			for range r.IntN(4) {
				m[strs[r.IntN(len(strs))]+"x"] = value(depth + 1)
			}
			return m
		}
	}
	for i := range 2000 {
		obj := map[string]any{}
		for range r.IntN(5) {
			obj[strs[r.IntN(len(strs))]+"k"] = value(0)
		}
		if r.IntN(5) > 0 {
			md := map[string]any{}
			for range r.IntN(4) {
				md[strs[r.IntN(len(strs))]+"m"] = value(0)
			}
			if r.IntN(5) > 0 {
				md["resourceVersion"] = strs[r.IntN(len(strs))] + "1"
			}
			obj["metadata"] = md
		}
		body, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		want, err := decodedVersion(body)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := answerVersion(body); err != nil || got != want {
			t.Fatalf("object %d %s: %q, %v; decoded: %q", i, body, got, err, want)
		}
	}
}

// BenchmarkAnswerVersion: reading the version of an apply's answer,
// scanning up to it, against decoding the whole answer for it.
func BenchmarkAnswerVersion(b *testing.B) {
	body := []byte(answer)
	b.Run("scan", func(b *testing.B) {
		for b.Loop() {
			if _, err := answerVersion(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodedVersion(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// decodedVersion is metadata.resourceVersion as decoding the whole object
// with encoding/json finds it (what ApplyVersion did before answerVersion).
func decodedVersion(body []byte) (string, error) {
	var full struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	err := json.Unmarshal(body, &full)
	return full.Metadata.ResourceVersion, err
}
