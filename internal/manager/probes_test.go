package manager

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/reload"
)

func TestProbesReportFileErrors(t *testing.T) {
	eng := engine.New(engine.Options{})
	probe := httptest.NewServer(probes(eng, &fileErrors{}, Single{}))
	defer probe.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(probe.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, b.String()
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d", code)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before any rule set is in force = %d, want 503", code)
	}

	set, err := rules.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	eng.Apply(t.Context(), set)
	files := &fileErrors{}
	files.report(klog.Background(), []reload.FileError{{Path: "/rules/bad.yaml", Err: errors.New(`bad.yaml:3:1: unknown field "wen"`), LastGood: true}})
	probe.Config.Handler = probes(eng, files, Single{})
	code, body := get("/readyz")
	if code != http.StatusOK {
		t.Errorf("/readyz with a broken file whose last good version is in force = %d, want 200", code)
	}
	if !strings.Contains(body, `file /rules/bad.yaml: bad.yaml:3:1: unknown field "wen" (its last good version stays in force)`) {
		t.Errorf("/readyz body lacks the file error:\n%s", body)
	}
}
