package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
)

// series records the label values the webhook's metrics are given, from
// reviews served at once too.
type series struct {
	mu        sync.Mutex
	converted map[[4]string]int
	reviewed  map[string]int
	refused   map[string]int
}

func newSeries() *series {
	return &series{converted: map[[4]string]int{}, reviewed: map[string]int{}, refused: map[string]int{}}
}

func (s *series) Converted(kind, from, to, result string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.converted[[4]string{kind, from, to, result}]++
}

func (s *series) Reviewed(kind string, _ time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reviewed[kind]++
}

func (s *series) Refused(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused[reason]++
}

// reviewBody is a ConversionReview of objs to version to, as the API
// server sends it.
func reviewBody(to string, objs ...string) []byte {
	return []byte(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"u-1","desiredAPIVersion":"` +
		to + `","objects":[` + strings.Join(objs, ",") + `]}}`)
}

// post serves one review of body and returns the recorded answer.
func post(h http.Handler, body []byte) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/convert", bytes.NewReader(body)))
	return rec
}

// TestReviewLabelsBounded: whoever sends reviews, naming whatever kinds
// and versions, the metrics are labelled with the kinds syncloop converts
// and their versions, or "other" — a thousand reviews of distinct unknown
// kinds, groups and versions, and of the kind syncloop converts in
// versions it does not have, make no more series than those values allow.
func TestReviewLabelsBounded(t *testing.T) {
	c := NewConverter()
	s := newSeries()
	c.Metrics = s
	c.Use(versionsSet(t))
	const n = 1000
	for i := range n {
		for _, b := range [][]byte{
			reviewBody(fmt.Sprintf("g%d.example.dev/w%d", i, i), fmt.Sprintf(`{"apiVersion":"g%d.example.dev/v%d","kind":"K%d","metadata":{"name":"a"}}`, i, i, i)),
			reviewBody(fmt.Sprintf("example.syncloop.dev/x%d", i), fmt.Sprintf(`{"apiVersion":"example.syncloop.dev/v9%d","kind":"App","metadata":{"name":"a"}}`, i)),
			reviewBody(fmt.Sprintf("example.syncloop.dev/z%d", i), `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":1,"image":"x"}}`),
			reviewBody(fmt.Sprintf("other%d.dev/v1", i), `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":1,"image":"x"}}`),
			reviewBody("example.syncloop.dev/v1", fmt.Sprintf(`{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App%d","metadata":{"name":"a"}}`, i)),
		} {
			if rec := post(c, b); rec.Code != http.StatusOK {
				t.Fatalf("review %d: %d %s", i, rec.Code, rec.Body)
			}
		}
	}
	kinds, versions := []string{"App", "other"}, []string{"v1", "v1alpha1", "other"}
	for l := range s.converted {
		if !slices.Contains(kinds, l[0]) || !slices.Contains(versions, l[1]) || !slices.Contains(versions, l[2]) {
			t.Errorf("a series labelled %v: want kinds %v and versions %v only", l, kinds, versions)
		}
	}
	for k := range s.reviewed {
		if !slices.Contains(kinds, k) {
			t.Errorf("a review latency labelled kind %q: want %v only", k, kinds)
		}
	}
	if max := len(kinds) * len(versions) * len(versions) * 2; len(s.converted) > max || len(s.reviewed) > len(kinds) {
		t.Errorf("%d reviews of distinct kinds and versions made %d conversion series and %d latency series: want at most %d and %d",
			5*n, len(s.converted), len(s.reviewed), max, len(kinds))
	}
	want := map[[4]string]int{{"other", "other", "other", "failed"}: 2 * n, {"App", "other", "other", "failed"}: n, {"App", "v1alpha1", "other", "failed"}: 2 * n}
	if !maps.Equal(s.converted, want) {
		t.Errorf("the unknown kinds and versions counted %v, want %v", s.converted, want)
	}
}

// TestReviewChecksEveryObjectFirst: what every object of a review says it
// is — its kind, its version, and the version wanted — is checked before
// any object is decoded or converted: a review whose last object is of a
// kind, or a version, syncloop does not convert fails without one
// conversion made.
func TestReviewChecksEveryObjectFirst(t *testing.T) {
	alpha := `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":2,"image":"nginx:1.29"}}`
	for name, last := range map[string]string{
		"an unknown kind":            `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"Gadget","metadata":{"name":"z"}}`,
		"a version not the kind's":   `{"apiVersion":"example.syncloop.dev/v7","kind":"App","metadata":{"name":"z"}}`,
		"an object of another group": `{"apiVersion":"other.dev/v1alpha1","kind":"App","metadata":{"name":"z"}}`,
		"not an object":              `["apiVersion","kind"]`,
		"no kind":                    `{"metadata":{"name":"z"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			c := NewConverter()
			m := &counted{}
			c.Metrics = m
			c.Use(versionsSet(t))
			r := review(t, c, "example.syncloop.dev/v1", alpha, alpha, last)
			if r.Result.Status != metav1.StatusFailure || len(r.ConvertedObjects) != 0 {
				t.Errorf("result %+v, %d objects: want a failure", r.Result, len(r.ConvertedObjects))
			}
			if m.converted != 0 || m.failed != 1 {
				t.Errorf("%d objects converted and %d failed before the review failed: want 0 and 1", m.converted, m.failed)
			}
		})
	}
}

// allocated is what f allocates on the heap, in bytes.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// dense is a JSON array of about size bytes of {"a":0}: decoded into an
// any, over 40 times its size.
func dense(size int) string {
	var b strings.Builder
	b.WriteString(`[{"a":0}`)
	for b.Len() < size {
		b.WriteString(`,{"a":0}`)
	}
	b.WriteString("]")
	return b.String()
}

// TestReviewDecodesNothingUnchecked: an object that costs more to decode
// than all reviews may hold is not decoded — whether of a kind syncloop
// does not convert, or of its own kind — and is refused: serving the
// review allocates about its body twice (the body, its objects), never
// the forty-fold a decode of it would.
func TestReviewDecodesNothingUnchecked(t *testing.T) {
	big := dense(6 << 20)
	for name, obj := range map[string]string{
		"an unknown kind, its kind last": `{"metadata":{"name":"a"},"data":` + big + `,"apiVersion":"x.example.dev/v1","kind":"Unknown"}`,
		"the kind converted":             `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":1,"image":"x"},"status":{"data":` + big + `}}`,
		"a key spelled in capitals":      `{"apiVersion":"x.example.dev/v1","kind":"Unknown","metadata":{"name":"a"},"data":` + big + `,"KIND":"App","APIVERSION":"example.syncloop.dev/v1alpha1"}`,
	} {
		t.Run(name, func(t *testing.T) {
			c := NewConverter()
			c.Use(versionsSet(t))
			body := reviewBody("example.syncloop.dev/v1", obj)
			var rec *httptest.ResponseRecorder
			n := allocated(func() { rec = post(c, body) })
			var out struct {
				Response struct{ Result metav1.Status }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &out); rec.Code != http.StatusOK || err != nil || out.Response.Result.Status != metav1.StatusFailure {
				t.Fatalf("%d %.300s: want a failed review", rec.Code, rec.Body)
			}
			if limit := 3 * uint64(len(body)); n > limit {
				t.Errorf("serving a review of %d MiB allocated %d MiB: want at most %d MiB (the body, its objects), no decode of them", len(body)>>20, n>>20, limit>>20)
			}
		})
	}
}

// TestReviewCaseFoldedKeys: the check of what an object is reads its keys
// as JSON decoding matches them, in any case; an object whose own kind
// or apiVersion then says otherwise ("kind": "Unknown" beside "KIND":
// "App") is refused, never converted as the kind it claimed.
func TestReviewCaseFoldedKeys(t *testing.T) {
	c := NewConverter()
	m := &counted{}
	c.Metrics = m
	c.Use(versionsSet(t))
	for _, obj := range []string{
		`{"kind":"Unknown","apiVersion":"example.syncloop.dev/v1alpha1","KIND":"App","metadata":{"name":"a"},"spec":{"size":1,"image":"x"}}`,
		`{"kind":"App","apiVersion":"example.syncloop.dev/v9","ApiVersion":"example.syncloop.dev/v1alpha1","metadata":{"name":"a"},"spec":{"size":1,"image":"x"}}`,
	} {
		r := review(t, c, "example.syncloop.dev/v1", obj)
		if r.Result.Status != metav1.StatusFailure || len(r.ConvertedObjects) != 0 {
			t.Errorf("%s: result %+v, %d objects: want a failure", obj, r.Result, len(r.ConvertedObjects))
		}
	}
	if m.converted != 0 {
		t.Errorf("%d objects converted as a kind they are not", m.converted)
	}
}

// TestReviewPanicContained: a conversion that panics fails its review
// with the panic's message, and the webhook goes on converting.
func TestReviewPanicContained(t *testing.T) {
	c := NewConverter()
	c.Use(versionsSet(t))
	// Two versions and no conversion between them: converting panics.
	broken := &rules.API{KindRef: rules.KindRef{APIVersion: "example.syncloop.dev/v1", Kind: "Broken",
		GVK: schema.GroupVersionKind{Group: "example.syncloop.dev", Version: "v1", Kind: "Broken"}},
		Plural: "brokens", Versions: []*rules.Version{{Name: "v1"}, {Name: "v2"}}}
	c.Keep(broken)
	r := review(t, c, "example.syncloop.dev/v2", `{"apiVersion":"example.syncloop.dev/v1","kind":"Broken","metadata":{"name":"a"}}`)
	if r.Result.Status != metav1.StatusFailure || !strings.Contains(r.Result.Message, "panic") {
		t.Errorf("a conversion that panics: %+v, want a failure that says so", r.Result)
	}
	alpha := `{"apiVersion":"example.syncloop.dev/v1alpha1","kind":"App","metadata":{"name":"a"},"spec":{"size":2,"image":"nginx:1.29"}}`
	if r := review(t, c, "example.syncloop.dev/v1", alpha); r.Result.Status != metav1.StatusSuccess || len(r.ConvertedObjects) != 1 {
		t.Errorf("after a panic: %+v", r.Result)
	}
}

// TestDecodedSize: decodedSize, counted from the bytes alone, is never
// less than the heap a decode into an any holds, for the shapes that
// cost most per byte and for a Kubernetes-like object; strings, escaped
// quotes within them included, count as their bytes only.
func TestDecodedSize(t *testing.T) {
	for _, tc := range []struct{ name, elem string }{
		{"numbers", "0"}, {"booleans", "true"}, {"empty strings", `""`}, {"strings", `"a"`},
		{"empty arrays", "[]"}, {"arrays of one", "[0]"}, {"empty objects", "{}"},
		{"objects of one member", `{"a":0}`}, {"objects of two", `{"a":0,"b":0}`},
		{"nested objects", `{"a":{"a":{"a":{"a":0}}}}`},
		{"a container", `{"name":"c","image":"registry.example.com/app:v1.2.3","ports":[{"containerPort":8080,"protocol":"TCP"}],"env":[{"name":"A","value":"b"}],"resources":{"limits":{"cpu":"1","memory":"1Gi"}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			b.WriteString(`{"items":[` + tc.elem)
			for b.Len() < 1<<20 {
				b.WriteString("," + tc.elem)
			}
			b.WriteString("]}")
			raw := b.Bytes()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var v any
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatal(err)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(v)
			if held := int64(after.HeapAlloc) - int64(before.HeapAlloc); decodedSize(raw) < held {
				t.Errorf("decodedSize %d, but the decode holds %d bytes", decodedSize(raw), held)
			}
		})
	}
	for raw, want := range map[string]int64{
		`"{[,:]}"`:          8 + perToken,
		`"a\"{,\\"`:         9 + perToken,
		`{"a":[1,"\",",2]}`: 17 + perToken*6 + perObject,
	} {
		if got := decodedSize([]byte(raw)); got != want {
			t.Errorf("decodedSize(%s) = %d, want %d", raw, got, want)
		}
	}
}

// TestRefusalQuotesClipped: a review whose apiVersion is nearly 16 MiB of
// invalid bytes is refused with an answer of a few hundred bytes. Quoted
// whole (twice, each byte decoded as three), the answer was 95 MiB and
// the heap grew 682 MiB, charged 64.
func TestRefusalQuotesClipped(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview","request":{"uid":"u","desiredAPIVersion":"x/v1","objects":[{"kind":"K","apiVersion":"a/b/`)
	b.Write(bytes.Repeat([]byte{0xff}, maxReviewBytes-300))
	b.WriteString(`"}]}}`)
	rec := httptest.NewRecorder()
	NewConverter().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/convert", &b))
	if n := rec.Body.Len(); n > 4<<10 || !strings.Contains(rec.Body.String(), "bytes)") {
		t.Errorf("the refusal of a hostile apiVersion: %d bytes, %.200q; want a few hundred, the value clipped", n, rec.Body.String())
	}
}
