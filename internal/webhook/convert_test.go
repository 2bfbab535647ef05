package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/expr"
)

type counted struct{ converted, failed int }

func (c *counted) Converted(_, _, _, result string) {
	if result == "converted" {
		c.converted++
	} else {
		c.failed++
	}
}
func (c *counted) Reviewed(string, time.Duration) {}
func (c *counted) Refused(string)                 {}

func versionsSet(t testing.TB) *rules.Set {
	t.Helper()
	l, err := rules.NewLoader(expr.Options{CostLimit: expr.DefaultCostLimit})
	if err != nil {
		t.Fatal(err)
	}
	set, err := l.Load("../../rules/testdata/api/versions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return set
}

func review(t *testing.T, h http.Handler, to string, objs ...string) *apiextv1.ConversionResponse {
	t.Helper()
	req := &apiextv1.ConversionReview{TypeMeta: metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "ConversionReview"},
		Request: &apiextv1.ConversionRequest{UID: "u-1", DesiredAPIVersion: to}}
	for _, o := range objs {
		req.Request.Objects = append(req.Request.Objects, runtime.RawExtension{Raw: []byte(o)})
	}
	body, _ := json.Marshal(req)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/convert", bytes.NewReader(body)))
	var out apiextv1.ConversionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("response %d %q: %v", rec.Code, rec.Body.String(), err)
	}
	if out.Response.UID != "u-1" {
		t.Errorf("uid %q, want the request's", out.Response.UID)
	}
	return out.Response
}

// TestReview: a review converts every object it holds, or fails whole
// with the reason; a kind no rule defines fails; a rule removed keeps
// its conversion.
func TestReview(t *testing.T) {
	c := NewConverter()
	m := &counted{}
	c.Metrics = m
	alpha := `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":2,"image":"nginx:1.29"}}`
	if r := review(t, c, "example.syncloop.dev/v1", alpha); r.Result.Status != metav1.StatusFailure || !strings.Contains(r.Result.Message, "no rule defines it") {
		t.Errorf("before any rule: %+v", r.Result)
	}
	c.Use(versionsSet(t))
	r := review(t, c, "example.syncloop.dev/v1", alpha, alpha)
	if r.Result.Status != metav1.StatusSuccess || len(r.ConvertedObjects) != 2 {
		t.Fatalf("result %+v, %d objects", r.Result, len(r.ConvertedObjects))
	}
	var got map[string]any
	_ = json.Unmarshal(r.ConvertedObjects[0].Raw, &got)
	if spec := got["spec"].(map[string]any); got["apiVersion"] != "example.syncloop.dev/v1" || spec["replicas"] != float64(2) || spec["tag"] != "1.29" {
		t.Errorf("converted %v", got)
	}
	bad := `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"b"},"spec":{"image":"x"}}`
	if r := review(t, c, "example.syncloop.dev/v1", alpha, bad); r.Result.Status != metav1.StatusFailure || len(r.ConvertedObjects) != 0 || !strings.Contains(r.Result.Message, "App b") {
		t.Errorf("an object that does not convert: %+v, %d objects", r.Result, len(r.ConvertedObjects))
	}
	if m.converted != 3 || m.failed != 2 { // 1 unknown kind, 1 without size
		t.Errorf("counted %+v", *m)
	}
	c.Use(versionsSet(t).Only(func(*rules.Rule) bool { return false }))
	if r := review(t, c, "example.syncloop.dev/v1", alpha); r.Result.Status != metav1.StatusSuccess {
		t.Errorf("after the rule left the set: %+v", r.Result)
	}
}
