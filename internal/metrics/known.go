package metrics

// Known are the label values known in advance. A counter's series is made
// at 0 for each of them before the first event could count one, so that
// an alert on its increase sees the first panic, watch error or failure:
// increase() of a series that appears at 1 is nothing (Prometheus'
// instrumentation practices, "Avoid missing metrics").
type Known struct {
	// Results of a reconcile (ReconcileDone), Writes (Write), Panics
	// (Panicked) where a unit of work of a rule contains them, and
	// CRDResults of the applies of the CRD of a kind a rule defines
	// (CRDApplied): made at 0 for each rule by RuleLoaded.
	Results, Writes, Panics, CRDResults []string
	// UnruledPanics are where a panic belongs to no rule (a rule file's
	// load): made at 0 by New.
	UnruledPanics []string
	// WatchReasons are the reasons of failed lists and watches
	// (WatchError) known in advance: made at 0 for each resource by
	// Watching, and never counted against MaxReasons.
	WatchReasons []string
}

// RuleLoaded makes rule's series of the values known in advance at 0:
// its reconciles, writes, panics and reconcile durations, and, when the
// rule defines a kind (spec.api), its CRD's applies. It is called when
// the rule loads, before its CRD, its revision or its loop does anything;
// RuleRemoved takes the series away with the rule.
func (m *Metrics) RuleLoaded(rule string, definesKind bool) {
	for _, r := range m.known.Results {
		m.reconciles.WithLabelValues(rule, r)
	}
	m.duration.WithLabelValues(rule)
	for _, w := range m.known.Writes {
		m.writes.WithLabelValues(rule, w)
	}
	for _, where := range m.known.Panics {
		m.panics.WithLabelValues(rule, where)
	}
	if definesKind {
		for _, r := range m.known.CRDResults {
			m.crds.WithLabelValues(rule, r)
		}
	}
}
