// Package expr owns syncloop's expression language: the CEL environment that
// rules are written in, compiled predicates and values (Program), and the
// ${} template language (Template) that turns a YAML tree into a rendered
// object.
//
// Everything here is compiled once, when rules load, and evaluated many times,
// concurrently, by reconcile workers: Programs and Templates are immutable and
// safe for concurrent use. Each evaluation runs under a cost limit; exceeding
// it is an error that wraps ErrCostLimit, never a crash or a hang.
//
// The names an expression may use are:
//
//	object       the trigger object
//	lookups.<id> a looked-up object, or list of them
//	variables    the rule's variables declared before this expression
//	rule         the rule's name
//	item, index  the element and its position, inside a forEach resource only
//	children     the live children by resource id: in status, and the
//	             dependencies a resource reads
//	ready        in status: whether each resource is ready
//	self         in readyWhen, alone: the child judged
//
// A reference to an undeclared variable or child id is a compile error.
// With Types, object, lookups.<id>, children.<id>, self and item are typed
// from their kinds' OpenAPI schemas (Type), as Kubernetes CEL types
// objects: a field the schema does not have is a compile error, and values
// are converted when read (bytes, timestamps, durations, doubles).
//
// The package knows nothing about YAML, files or Kubernetes objects (only
// OpenAPI schemas, for types): it sees trees of Go values (map[string]any,
// []any, string, int64, float64, bool, nil) and reports errors with a path into that tree and an offset into the
// string, which the rules package turns into file:line:col.
package expr
