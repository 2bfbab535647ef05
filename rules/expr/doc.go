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
//	object      the trigger object, as a map
//	variables   the rule's variables declared before this expression
//	rule        the rule's name
//	item, index the element and its position, inside a forEach resource only
//	children    in status only: the live children by resource id
//
// A reference to an undeclared variable or child id is a compile error.
//
// The package knows nothing about YAML, files or Kubernetes objects: it sees
// trees of Go values (map[string]any, []any, string, int64, float64, bool,
// nil) and reports errors with a path into that tree and an offset into the
// string, which the rules package turns into file:line:col.
package expr
