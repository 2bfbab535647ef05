// Package rules owns syncloop's rule format (syncloop.dev/v1alpha1, kind
// Rule): the Go types, strict YAML decoding with file:line:col errors,
// defaults, validation, and the loaded, immutable Set with a content hash per
// rule. It renders a rule against a trigger object into desired children and
// status, as a pure function, and decides whose an existing object is
// (Rule.Takeover): what syncloop may write is decided here, for the engine
// and the offline commands alike.
//
// It knows nothing about clusters, informers or workqueues: the engine calls
// it, and the CLI's offline commands (validate, render) call it without a
// cluster. CEL compilation and ${} templates live in rules/expr.
package rules
