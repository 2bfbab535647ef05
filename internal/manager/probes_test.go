package manager

import (
	"errors"
	"io"
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
	probe := httptest.NewServer(probes(eng, &fileErrors{}, &crdKeeper{}, &revisionKeeper{}, nil, Single{}, nil))
	defer probe.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(probe.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
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
	eng.Enforce(t.Context(), set)
	files := &fileErrors{}
	files.report(klog.Background(), []reload.FileError{{Path: "/rules/bad.yaml", Err: errors.New(`bad.yaml:3:1: unknown field "wen"`), LastGood: true}})
	probe.Config.Handler = probes(eng, files, &crdKeeper{}, &revisionKeeper{}, nil, Single{}, nil)
	code, body := get("/readyz")
	if code != http.StatusOK {
		t.Errorf("/readyz with a broken file whose last good version is in force = %d, want 200", code)
	}
	if !strings.Contains(body, `file /rules/bad.yaml: bad.yaml:3:1: unknown field "wen" (its last good version stays in force)`) {
		t.Errorf("/readyz body lacks the file error:\n%s", body)
	}
}

// TestProbesShardState: a sharded replica's /readyz starts with its shard
// state, and it is not ready while it joins or hands over (the member's
// states are shard.TestMemberStatus's).
func TestProbesShardState(t *testing.T) {
	eng := engine.New(engine.Options{})
	set, err := rules.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	eng.Enforce(t.Context(), set)
	mode := &statusMode{}
	probe := httptest.NewServer(probes(eng, &fileErrors{}, &crdKeeper{}, &revisionKeeper{}, nil, mode, nil))
	defer probe.Close()
	get := func() (int, string) {
		resp, err := http.Get(probe.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		status modeStatus
		code   int
	}{
		{modeStatus{line: "shard: joining group g as a (Lease ns/g-shard-a)"}, http.StatusServiceUnavailable},
		{modeStatus{line: "shard: member a of group g, handing over: members [a,b,c], working under [a,b]"}, http.StatusServiceUnavailable},
		{modeStatus{line: "shard: member a of group g, members [a,b]", ready: true}, http.StatusOK},
	} {
		mode.st = tc.status
		code, body := get()
		if code != tc.code || !strings.HasPrefix(body, tc.status.line+"\n") {
			t.Errorf("/readyz = %d %q, want %d starting %q", code, body, tc.code, tc.status.line)
		}
	}
}

// statusMode is a Mode whose status is st.
type statusMode struct {
	Single
	st modeStatus
}

func (m *statusMode) status() modeStatus { return m.st }

// TestProbesHostile: a rule file's error holding escape sequences, a
// return and a forged line (a file a tenant wrote, a value it quotes),
// and a cluster line holding a bidi override, show in /readyz escaped,
// each on its own line.
func TestProbesHostile(t *testing.T) {
	eng := engine.New(engine.Options{})
	set, err := rules.NewSet()
	if err != nil {
		t.Fatal(err)
	}
	eng.Enforce(t.Context(), set)
	files := &fileErrors{}
	files.report(klog.Background(), []reload.FileError{{Path: "/rules/\x1b]0;pwned\x07.yaml", Err: errors.New("bad\x1b[2J\rrule x: running\nrule y: running"), LastGood: true}})
	clusters := func() []string { return []string{"cluster \u202eevil: answers\u009b"} }
	probe := httptest.NewServer(probes(eng, files, &crdKeeper{}, &revisionKeeper{}, nil, Single{}, clusters))
	defer probe.Close()
	resp, err := http.Get(probe.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	for _, r := range body {
		if r < 0x20 && r != '\n' || r == 0x7f || r >= 0x80 && r < 0xa0 || r >= 0x202a && r <= 0x202e {
			t.Errorf("/readyz holds %U raw:\n%q", r, body)
		}
	}
	if lines := strings.Count(body, "\n"); lines != 2 || strings.Contains(body, "\nrule y") {
		t.Errorf("/readyz has %d lines, want 2 (the file, the cluster): a value forged lines\n%s", lines, body)
	}
	if !strings.Contains(body, `file /rules/\x1b]0;pwned\a.yaml: bad\x1b[2J\rrule x: running\nrule y: running`) || !strings.Contains(body, `cluster \u202eevil: answers\u009b`) {
		t.Errorf("/readyz does not show the values escaped:\n%s", body)
	}
}
