package manager

import (
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/internal/panics"
)

// Where the manager contains a panic (syncloop_panics_total's where).
const (
	panicLoad      = "load"      // a rule file's parse (rules.Loader.ReportPanics)
	panicCRDs      = "crds"      // keeping the CRD of a kind a rule defines
	panicRevisions = "revisions" // recording a rule's revision
	panicModules   = "modules"   // releasing the compiled modules no rule calls
)

// containRule runs fn, the keeping of one rule's CRD or revision, and
// contains a panic in it: it is that rule's error, its stack logged and
// counted (count may be nil) — the other rules' are kept, and syncloop
// goes on.
func containRule(logger klog.Logger, count func(rule, where string), rule, where string, fn func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			pe := panics.New(v)
			reportPanic(logger, count, rule, where, pe)
			err = pe
		}
	}()
	return fn()
}

// reportPanic logs a contained panic with its stack and counts it.
func reportPanic(logger klog.Logger, count func(rule, where string), rule, where string, pe *panics.Error) {
	logger.Error(pe, "Panic contained: the unit of work failed, syncloop goes on", "rule", rule, "where", where, "stack", string(pe.Stack))
	if count != nil {
		count(rule, where)
	}
}
