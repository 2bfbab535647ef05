package guest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestServe: one request read whole, or one per line; each answer one
// line of JSON; an error stops.
func TestServe(t *testing.T) {
	echo := func(input []byte) (any, error) {
		var in struct{ N int }
		if err := json.Unmarshal(input, &in); err != nil {
			return nil, err
		}
		if in.N < 0 {
			return nil, errors.New("negative")
		}
		return map[string]int{"twice": 2 * in.N}, nil
	}
	var out strings.Builder
	if err := serve(strings.NewReader(`{"N": 2}`), &out, false, echo); err != nil || out.String() != "{\"twice\":4}\n" {
		t.Errorf("one call: %v, %q", err, out.String())
	}
	out.Reset()
	if err := serve(strings.NewReader("{\"N\":1}\n{\"N\":3}\n"), &out, true, echo); err != nil || out.String() != "{\"twice\":2}\n{\"twice\":6}\n" {
		t.Errorf("served: %v, %q", err, out.String())
	}
	out.Reset()
	if err := serve(strings.NewReader("{\"N\":1}\n{\"N\":-1}\n{\"N\":3}\n"), &out, true, echo); err == nil || err.Error() != "negative" || out.String() != "{\"twice\":2}\n" {
		t.Errorf("an error: %v, %q", err, out.String())
	}
}
