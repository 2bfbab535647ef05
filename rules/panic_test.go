package rules

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/internal/panics"
)

// panickyCRDs is a CRDSource that panics: code a rule file's load runs
// that panics on what the file holds.
type panickyCRDs struct{}

func (panickyCRDs) CRD(string) (*unstructured.Unstructured, error) { panic("injected into a CRD read") }

// TestParseContainsPanics: a panic while a rule file loads is that file's
// error, at the file, carrying the panic; it is reported once to
// ReportPanics's function, and the loader goes on loading other files.
func TestParseContainsPanics(t *testing.T) {
	l := newLoader(t)
	l.UseServedCRDs(panickyCRDs{}, true)
	var reported []string
	l.ReportPanics(func(path string, err *panics.Error) {
		reported = append(reported, path)
		if !strings.Contains(string(err.Stack), "panickyCRDs") {
			t.Errorf("the stack does not say where the panic came from:\n%s", err.Stack)
		}
	})
	data, err := os.ReadFile(filepath.Join("testdata", "api", "app.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Parse("app.yaml", data)
	if f != nil {
		t.Errorf("a parse that panicked returned %d rules", len(f.Rules))
	}
	if _, ok := errors.AsType[*panics.Error](err); !ok {
		t.Fatalf("err = %v, want a recovered panic", err)
	}
	if !strings.HasPrefix(err.Error(), "app.yaml: panic: injected into a CRD read") {
		t.Errorf("err = %q, want the file and the panic", err)
	}
	if len(reported) != 1 || reported[0] != "app.yaml" {
		t.Errorf("reported %v, want app.yaml once", reported)
	}
	if _, err := l.Parse("plain.yaml", []byte(head+watchNS+cm)); err != nil {
		t.Errorf("the next file: %v", err)
	}
}

// TestHostileAPIMarkers: rule files that once panicked the process — as
// tenant ConfigMaps, anyone who may create one in any namespace could
// crash-loop syncloop — are errors at the marker or type that breaks
// them, found at parse time; none reaches a panic, contained or not.
func TestHostileAPIMarkers(t *testing.T) {
	l := newLoader(t)
	var panicked []string
	l.ReportPanics(func(path string, err *panics.Error) { panicked = append(panicked, path+": "+err.Error()) })
	rule := func(field string) string {
		return "apiVersion: syncloop.dev/v1alpha1\nkind: Rule\nmetadata: {name: x}\nspec:\n  api:\n    apiVersion: example.com/v1\n    kind: X\n    spec:\n      " + field + "\n  resources: []\n"
	}
	for _, tt := range []struct{ field, want string }{
		{"n: number | minimum=NaN", `api.yaml:9:27: rule "x": spec.api.spec.n: marker minimum: "NaN" is not a finite number`},
		{"n: number | maximum=Inf", `marker maximum: "Inf" is not a finite number`},
		{"n: number | default=-Inf", `marker default: "-Inf" is not a finite number`},
		{"n: number | enum=infinity", `marker enum: "infinity" is not a finite number`},
		{`n: "` + strings.Repeat("[]", 10_000) + `number"`, "the type nests more than 32 lists and maps deep"},
	} {
		_, err := l.Parse("api.yaml", []byte(rule(tt.field)))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.40s: err = %v, want %q", tt.field, err, tt.want)
		}
	}
	if len(panicked) > 0 {
		t.Errorf("parses panicked: %q", panicked)
	}
}
