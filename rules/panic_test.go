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

