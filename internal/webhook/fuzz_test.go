package webhook

import (
	"encoding/json"
	"net/http"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzConversionReview feeds arbitrary bytes to the webhook as the body
// of a review, as anyone who reaches its port can: it answers 200 with a
// ConversionReview for the request's UID — as many objects as were
// given, each in the version wanted, or a failure saying why — or
// refuses the body 400 or 413, and never panics.
func FuzzConversionReview(f *testing.F) {
	v1 := `{"apiVersion":"example.syncloop.dev/v1","kind":"App","metadata":{"name":"b","annotations":{"conversion.syncloop.dev/v1":"{\"spec\":{\"ports\":[80]}}"}},"spec":{"replicas":3,"image":"nginx","tag":"1","ports":[80]}}`
	for _, seed := range [][]byte{
		reviewBody("example.syncloop.dev/v1", alphaApp, alphaApp),
		reviewBody("example.syncloop.dev/v1alpha1", v1),
		reviewBody("example.syncloop.dev/v1", `{"apiVersion":"x.example.dev/v1","kind":"Unknown","metadata":{"name":"a"}}`),
		reviewBody("example.syncloop.dev/v1", `{"kind":"Unknown","apiVersion":"example.syncloop.dev/v1alpha1","KIND":"App","spec":{}}`),
		reviewBody("example.syncloop.dev/v1", `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","spec":{"size":"x","image":[1]}}`),
		reviewBody("example.syncloop.dev/v1", `null`, `[]`, `"s"`),
		reviewBody("example.syncloop.dev/v1"),
		reviewBody("::", alphaApp),
		[]byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":null}`),
		[]byte(`{"apiVersion":"apiextensions.k8s.io/v1beta1","kind":"ConversionReview","request":{"objects":[]}}`),
		[]byte(`null`),
		[]byte(`{"request":{"uid":"\u0000","objects":[{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App"}]}`),
	} {
		f.Add(seed)
	}
	c := NewConverter()
	c.Use(versionsSet(f))
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := post(c, body)
		switch rec.Code {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			return
		case http.StatusOK:
		default:
			t.Fatalf("answered %d %q", rec.Code, rec.Body)
		}
		env, err := decodeEnvelope(body)
		if err != nil {
			t.Fatalf("answered 200 a body that is not a review: %v", err)
		}
		var out apiextv1.ConversionReview
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.APIVersion != reviewAPIVersion || out.Kind != "ConversionReview" {
			t.Fatalf("an answer that is not a ConversionReview response (%v): %q", err, rec.Body)
		}
		r := out.Response
		if r.UID != env.Request.UID {
			t.Errorf("answered uid %q to a request of %q", r.UID, env.Request.UID)
		}
		switch r.Result.Status {
		case metav1.StatusSuccess:
			if len(r.ConvertedObjects) != len(env.Request.Objects) {
				t.Fatalf("%d objects converted of %d", len(r.ConvertedObjects), len(env.Request.Objects))
			}
			for _, o := range r.ConvertedObjects {
				var h head
				if err := json.Unmarshal(o.Raw, &h); err != nil || h.APIVersion != env.Request.DesiredAPIVersion {
					t.Errorf("an object converted to %q, not %q (%v)", h.APIVersion, env.Request.DesiredAPIVersion, err)
				}
			}
		case metav1.StatusFailure:
			if r.Result.Message == "" || len(r.ConvertedObjects) != 0 {
				t.Errorf("a failure without a message, or with %d objects", len(r.ConvertedObjects))
			}
		default:
			t.Errorf("result status %q", r.Result.Status)
		}
	})
}
