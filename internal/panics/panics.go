// Package panics contains a panic at the boundary of one unit of work — a
// trigger's reconcile, an event handler, a rule file's load, the keeping of
// a CRD — so that it fails that unit alone and never the process: a
// controller that one object can crash crash-loops on that object, and
// every rule stops with it.
//
// It knows nothing of what the units are. Callers defer Recover (or call
// New from a deferred recover of their own), then count, log and report
// the *Error as they report any error of the unit: its message carries
// the panic's value, its Stack where it came from.
package panics

import (
	"fmt"
	"runtime/debug"
)

// Error is a panic recovered at a unit's boundary.
type Error struct {
	// Value is what the code panicked with.
	Value any
	// Stack is the panicking goroutine's stack, for the log: never for
	// Events or status, which users other than the operator read.
	Stack []byte
}

func (e *Error) Error() string {
	return fmt.Sprintf("panic: %v (recovered; the stack is in syncloop's log)", e.Value)
}

// Unwrap is the panic's value when it is an error (a runtime error, say).
func (e *Error) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// New is the Error of v, a value recover returned; it must be called on
// the panicking goroutine, from the deferred function, for Stack to say
// where the panic came from.
func New(v any) *Error { return &Error{Value: v, Stack: debug.Stack()} }

// Recover, deferred, turns a panic of the function that deferred it into
// *err. It must be deferred itself (defer panics.Recover(&err)), not
// called from another deferred function: recover only stops a panic
// there.
func Recover(err *error) {
	if v := recover(); v != nil {
		*err = New(v)
	}
}
