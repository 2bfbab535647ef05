package dynamic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

// TestMarshalJSON: MarshalJSON makes the very bytes encoding/json.Marshal
// makes — of objects as decoded and as rendered, of random trees, and of
// strings and numbers that need escaping or formatting — so that a hash of
// them is the hash written before.
func TestMarshalJSON(t *testing.T) {
	child, err := runtime.DefaultUnstructuredConverter.ToUnstructured(benchChild())
	if err != nil {
		t.Fatal(err)
	}
	tricky := []any{
		"", "plain", `quote " and \ backslash`, "<html> & co", "tab\tnew\nline\r", "\b\f\x00\x1f\x7f",
		"ünïcödé", "line\u2028sep\u2029", "bad \xff utf-8", "emoji 🎉",
		int64(0), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), 3, int32(-7),
		0.0, 1.5, -2.25, 1e-7, 1e21, 123456789.125, math.SmallestNonzeroFloat64, float64(1 << 53),
		true, false, nil, map[string]any{}, []any{}, map[string]any(nil), []any(nil),
		map[string]string{"b": "2", "a": "1"}, []string{"x", "<y>"}, json.Number("12.50"),
	}
	cases := []map[string]any{child, {"tricky": tricky}}
	for _, v := range tricky {
		cases = append(cases, map[string]any{fmt.Sprint(v): v})
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		cases = append(cases, randomTree(r, 4).(map[string]any))
	}
	for i, c := range cases {
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := MarshalJSON(c)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("case %d:\n got %s\nwant %s", i, got, want)
		}
	}
	if _, err := MarshalJSON(map[string]any{"f": math.NaN()}); err == nil {
		t.Error("NaN encoded, as encoding/json refuses")
	}
}

// randomTree is a random unstructured value; depth bounds its nesting.
func randomTree(r *rand.Rand, depth int) any {
	keys := []string{"a", "B", "ab", "a b", "é", "<k>", "z", ""}
	switch n := r.IntN(9); {
	case depth == 4 || n == 0 && depth > 0:
		m := map[string]any{}
		for range r.IntN(5) {
			m[keys[r.IntN(len(keys))]+fmt.Sprint(r.IntN(3))] = randomTree(r, depth-1)
		}
		return m
	case n == 1 && depth > 0:
		l := make([]any, r.IntN(4))
		for i := range l {
			l[i] = randomTree(r, depth-1)
		}
		return l
	case n == 2:
		return r.Int64() - r.Int64()
	case n == 3:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
	case n == 4:
		return r.IntN(2) == 0
	case n == 5:
		return nil
	default:
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = byte(0x20 + r.IntN(0x60))
			if r.IntN(20) == 0 {
				b[i] = byte(r.IntN(256))
			}
		}
		return string(b)
	}
}

// BenchmarkMarshalJSON compares MarshalJSON with encoding/json on a child
// as syncloop writes it.
func BenchmarkMarshalJSON(b *testing.B) {
	child, err := runtime.DefaultUnstructuredConverter.ToUnstructured(benchChild())
	if err != nil {
		b.Fatal(err)
	}
	delete(child["metadata"].(map[string]any), "managedFields")
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(child); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("MarshalJSON", func(b *testing.B) {
		for b.Loop() {
			if _, err := MarshalJSON(child); err != nil {
				b.Fatal(err)
			}
		}
	})
}
