package rules

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Pos is a place in a rule file. Line and Column are 1-based; Column is 0
// when only the line is known (YAML syntax errors).
type Pos struct {
	File   string
	Line   int
	Column int
}

func (p Pos) String() string {
	switch {
	case p.File == "":
		return ""
	case p.Line == 0:
		return p.File
	case p.Column == 0:
		return fmt.Sprintf("%s:%d", p.File, p.Line)
	}
	return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Column)
}

// Error is a problem in a rule file, at a place, in a rule, at a field:
//
//	examples/tenant/rules.yaml:14:9: rule "tenant-defaults": spec.when: undeclared reference to 'objet'
type Error struct {
	Pos   Pos
	Rule  string // empty when the rule's name is not known
	Field string // e.g. spec.resources[0].template.metadata.name
	Msg   string
	// Err is the error Msg says, when there is one to unwrap: a panic
	// the load contained (a *panics.Error).
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	if s := e.Pos.String(); s != "" {
		b.WriteString(s)
		b.WriteString(": ")
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, "rule %q: ", e.Rule)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Retryable is the cause of a file error that is not the file's doing: a
// read of the cluster that failed (the API server unreachable, a 5xx).
// The same file may load when it is read again, and a reload retries it.
type Retryable struct{ Err error }

func (e *Retryable) Error() string { return e.Err.Error() }
func (e *Retryable) Unwrap() error { return e.Err }

// IsRetryable reports whether err, or one it wraps, is Retryable.
func IsRetryable(err error) bool {
	_, ok := errors.AsType[*Retryable](err)
	return ok
}

// ErrorList is every problem found in a load, sorted by file and position.
type ErrorList []*Error

func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap is the list's errors, so that errors.Is and errors.As see each.
func (l ErrorList) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

func (l ErrorList) sort() {
	sort.SliceStable(l, func(i, j int) bool {
		a, b := l[i].Pos, l[j].Pos
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
}

// errOrNil returns the list as an error, or nil when it is empty.
func (l ErrorList) errOrNil() error {
	if len(l) == 0 {
		return nil
	}
	l.sort()
	return l
}
