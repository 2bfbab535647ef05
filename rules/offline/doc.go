// Package offline runs rules without a cluster: Render renders every rule
// of a set against objects read from files, as `syncloop render` does —
// the objects stand for the cluster: triggers, lookup sources, live
// children — and writes the result as YAML or JSON; RunTest loads a test
// document's rules and objects, renders them so, and checks its
// expectations, as `syncloop test` does.
//
// It is the harness of the offline commands: it imports the front end
// (rules) and the renderer (rules/render), and neither imports it. It
// does not decode test documents (the front end does: rules.ParseTests).
package offline
