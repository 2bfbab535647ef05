package manager

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/engine"
	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules/reload"
)

// fileErrors are the rule files that failed at the last load, for /readyz.
type fileErrors struct {
	mu   sync.Mutex
	errs []reload.FileError
}

// report logs each failed file and remembers them.
func (f *fileErrors) report(logger klog.Logger, errs []reload.FileError) {
	for _, e := range errs {
		logger.Error(e.Err, "Rule file not loaded", "file", e.Path, "lastGoodVersionInForce", e.LastGood)
	}
	f.mu.Lock()
	f.errs = errs
	f.mu.Unlock()
}

func (f *fileErrors) get() []reload.FileError {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.errs
}

// probes serves /healthz (the process runs) and /readyz: the mode's state,
// each rule's state and why one is not running, whether each cluster of
// the fleet answers (clusters, nil without one), and the rule files that
// failed to load. A replica is ready when its mode is and every rule's
// informers have synced, or when it stands by; a workload cluster that
// does not answer does not make it unready.
func probes(eng *engine.Engine, files *fileErrors, crds *crdKeeper, revisions *revisionKeeper, conv *conversions, mode Mode, clusters func() []string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := mode.status()
		// One line each, of what the cluster, the rules and their files
		// say: made printable, so that no value acts on the terminal of
		// whoever reads it, or passes for another line.
		var lines []string
		add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
		if st.line != "" {
			add("%s", st.line)
		}
		ready := true
		if !st.standby {
			states := eng.States()
			sort.Slice(states, func(i, j int) bool { return states[i].Rule < states[j].Rule })
			for _, s := range states {
				line := fmt.Sprintf("rule %s: %s", s.Rule, s.State)
				if s.Identity != "" {
					line += " as " + s.Identity
				}
				if s.Detail != "" {
					line += ": " + s.Detail
				}
				add("%s", line)
			}
			ready = st.ready && eng.Ready()
			// A rollout halted is a rule change waiting for the user,
			// not a replica unfit to serve.
			for _, r := range eng.Rollouts() {
				add("rollout %s: %s", r.Rule, rolloutLine(r))
			}
			if clusters != nil {
				lines = append(lines, clusters()...)
			}
		}
		for _, e := range files.get() {
			add("file %s: %v", e.Path, e)
		}
		// A revision not recorded is history missing, not a rule stopped.
		lines = append(lines, revisions.failed()...)
		lines = append(lines, crds.migrations.status()...)
		if line, ok := conv.status(); line != "" {
			add("%s", line)
			ready = ready && ok
		}
		if failed := crds.failed(); len(failed) > 0 {
			ready = false
			lines = append(lines, failed...)
		}
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		var b strings.Builder
		for _, l := range lines {
			b.WriteString(printable.Text(l) + "\n")
		}
		fmt.Fprint(w, b.String())
	})
	return mux
}

// rolloutLine says where a rollout stands, in one line.
func rolloutLine(r rollout.Status) string {
	line := fmt.Sprintf("%s, step %d of %d, %d triggers on revision %s, %d on %s", r.State, r.Step, r.Steps, r.OnTo, shortHash(r.To), r.OnFrom, shortHash(r.From))
	if r.Judging > 0 {
		line += fmt.Sprintf(", %d of the step's %d healthy", r.Healthy, r.Judging)
	}
	if r.ByCluster {
		line += ", by cluster: reached " + reachedClusters(r.Reached)
	}
	if r.Message != "" {
		line += ": " + r.Message
	}
	return line
}
