package dynamic

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
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

// TestAnswerVersionProtobuf: the version read from objects of several
// kinds as the API server encodes them in protobuf — with and without one,
// with every field set around it — is the one decoding the whole object
// finds; what is not the server's protobuf is an error.
func TestAnswerVersionProtobuf(t *testing.T) {
	enc := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	meta := metav1.ObjectMeta{Name: "tenant-t-00001", Namespace: "ns", UID: "6d1d3b0e", ResourceVersion: "48213",
		Labels: map[string]string{"resourceVersion": "no"}, Annotations: map[string]string{"a": strings.Repeat("x", 300)},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "syncloop/tenant-config", Operation: metav1.ManagedFieldsOperationApply,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:data":{"f:tier":{}}}`)}}}
	objects := []runtime.Object{
		&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: meta, Data: map[string]string{"tier": "bronze"}},
		&corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: meta, Data: map[string][]byte{"k": {0, 1, 2}}},
		&appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"}, ObjectMeta: meta,
			Spec: appsv1.DeploymentSpec{Replicas: new(int32(3)), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "no"}}}},
		&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: "no-version"}},
	}
	for _, obj := range objects {
		var body bytes.Buffer
		if err := enc.Encode(obj, &body); err != nil {
			t.Fatal(err)
		}
		decoded, _, err := enc.Decode(body.Bytes(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := decoded.(metav1.Object).GetResourceVersion()
		if got, err := answerVersionProtobuf(body.Bytes()); err != nil || got != want {
			t.Errorf("%T %s: %q, %v; decoded: %q", obj, obj.(metav1.Object).GetName(), got, err, want)
		}
		for _, cut := range []int{5, body.Len() / 2, body.Len() - 1} {
			if got, err := answerVersionProtobuf(body.Bytes()[:cut]); err == nil && got == want && want != "" {
				t.Errorf("%T cut to %d of %d bytes: %q and no error", obj, cut, body.Len(), got)
			}
		}
	}
	for _, bad := range []string{"", "{}", answer, "k8s\x00\x12\xff"} {
		if got, err := answerVersionProtobuf([]byte(bad)); err == nil {
			t.Errorf("%q: %q and no error", bad, got)
		}
	}
}

// TestMetadataIsFieldOne: every kind of client-go's whose apply is
// answered in protobuf holds its ObjectMeta in field 1, where
// answerVersionProtobuf reads it.
func TestMetadataIsFieldOne(t *testing.T) {
	checked := 0
	for gvk, typ := range scheme.Scheme.AllKnownTypes() {
		f, ok := typ.FieldByName("ObjectMeta")
		if !ok || f.Type != reflect.TypeFor[metav1.ObjectMeta]() {
			continue // a list, options, an event of a watch: never an apply's answer
		}
		if tag := f.Tag.Get("protobuf"); !strings.HasPrefix(tag, "bytes,1,") {
			t.Errorf("%s: ObjectMeta has protobuf tag %q, want field 1", gvk, tag)
		}
		checked++
	}
	if checked < 50 {
		t.Errorf("%d kinds checked; client-go has more", checked)
	}
}

// TestReadInto: what readInto appends is what io.ReadAll reads, however
// the reader hands it out and whatever room the buffer has; a failed read
// is an error.
func TestReadInto(t *testing.T) {
	data := []byte(strings.Repeat("0123456789", 1000))
	for _, c := range []struct {
		name string
		r    func() io.Reader
		buf  []byte
	}{
		{"one byte at a time, no room", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) }, nil},
		{"half at a time, some room", func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) }, make([]byte, 0, 100)},
		{"at once, room to spare", func() io.Reader { return bytes.NewReader(data) }, make([]byte, 3, 1<<15)},
		{"nothing", func() io.Reader { return bytes.NewReader(nil) }, make([]byte, 0, 10)},
	} {
		want := append(slices.Clone(c.buf), data...)
		if c.name == "nothing" {
			want = c.buf
		}
		got, err := readInto(c.buf, c.r())
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v; want %d", c.name, len(got), err, len(want))
		}
	}
	if _, err := readInto(nil, iotest.ErrReader(io.ErrUnexpectedEOF)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a failing reader: %v", err)
	}
}
