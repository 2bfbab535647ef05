// Package rules is the front end of syncloop's rule language
// (syncloop.dev/v1alpha1, kind Rule, and the test documents of `syncloop
// test`): the Go types, strict YAML decoding with file:line:col errors,
// defaults, validation, static typing of CEL against the kinds' schemas,
// the graph of resources and of lookups, and the loaded, immutable Set with
// a content hash per rule. It also says what syncloop's marks on objects
// are (labels, annotations, field managers) and how to read them, and,
// for the kinds rules define (spec.api), what their CustomResourceDefinition
// is — the simple schema compiled, the status typed from the rule — and
// whether a served one may become it (breaking changes); a CRDSource gives
// it the served ones, it never writes them.
//
// It does not render (rules/render does: a rule against a trigger, and
// whose an existing object is), nor run a rule offline or check a test's
// expectations (rules/offline does); it imports neither. It knows nothing
// about clusters, informers or workqueues. CEL compilation and ${}
// templates live in rules/expr, the kinds' schemas in rules/schema, the
// reload of rule files in rules/reload.
package rules
