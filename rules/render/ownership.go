package render

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules"
)

// ConflictError is a child that is not applied because an object syncloop
// may not write holds its name: an object without syncloop's ownership
// (unless adoption allows it), another rule's or trigger's child, or the
// object one of the trigger's lookups reads. Nothing is written to it; the
// trigger's other resources proceed and the resources that read this one
// wait.
type ConflictError struct {
	Rule     string
	Resource string
	Object   rules.ObjectRef
	// Why says whose the object is; Hint, when not empty, what would
	// allow the takeover.
	Why  string
	Hint string
}

func (e *ConflictError) Error() string {
	s := fmt.Sprintf("resource %q: %s %s", e.Resource, e.Object.Kind, e.Object.NamespacedName())
	s += " " + e.Why + ": not taking it over"
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// ContendedError is a child another writer keeps changing: syncloop
// repaired the fields it sets Repairs times within a short while, each
// time undone, and leaves them as they are until Until — a fight that
// would otherwise be a hot loop of writes hiding its cause. Managers are
// the field managers that hold the fields now (from managedFields).
type ContendedError struct {
	Resource string
	Object   rules.ObjectRef
	Managers []string
	Fields   []string
	Repairs  int
	Until    time.Time
}

func (e *ContendedError) Error() string {
	by := "another writer"
	if len(e.Managers) > 0 {
		by = "field manager " + strings.Join(quoted(e.Managers), ", ")
	}
	return fmt.Sprintf("resource %q: %s %s: %s keeps changing %s, which the rule sets: repaired %d times, left as it is until %s",
		e.Resource, e.Object.Kind, e.Object.NamespacedName(), by, strings.Join(e.Fields, ", "), e.Repairs, e.Until.UTC().Format(time.RFC3339))
}

func quoted(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}

// OnlyConflicts reports whether err is made of ConflictErrors alone
// (errors.Join of them, at any depth): a trigger whose only trouble is
// conflicts.
func OnlyConflicts(err error) bool { return only[*ConflictError](err) }

// only reports whether err is made of errors of type E alone (errors.Join
// of them, at any depth).
func only[E error](err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs := j.Unwrap()
		for _, e := range errs {
			if !only[E](e) {
				return false
			}
		}
		return len(errs) > 0
	}
	_, ok := errors.AsType[E](err)
	return ok
}

// Ownership is what syncloop's labels and annotations on an existing object
// say of it, for one rule and trigger.
type Ownership int

const (
	// Unowned: the object carries no mark of syncloop's.
	Unowned Ownership = iota
	// Owned: the object is this rule's child of this trigger — of this
	// trigger's name, whatever its UID (a trigger deleted and created
	// again finds its children again), in this installation (a child
	// without an installation label is the default installation's).
	Owned
	// OwnedElsewhere: the object is another rule's, another trigger's, or
	// another installation's.
	OwnedElsewhere
)

// OwnershipOf says whose obj is, for rule r and trigger t.
func OwnershipOf(r *rules.Rule, obj metav1.Object, t rules.Trigger) Ownership {
	// In place: this runs on every apply over an existing child, and
	// GetLabels and GetAnnotations copy.
	l := rules.Labels(obj)
	owner, hasOwner := rules.LookupAnnotation(obj, rules.AnnotationOwner)
	if l.Get(rules.LabelManagedBy) != rules.ManagedByValue && l.Get(rules.LabelRule) == "" && !hasOwner {
		return Unowned
	}
	if l.Get(rules.LabelManagedBy) == rules.ManagedByValue && l.Get(rules.LabelRule) == r.Name && sameTrigger(owner, t) && l.Get(rules.LabelInstallation) == r.Installation {
		return Owned
	}
	return OwnedElsewhere
}

// sameTrigger reports whether an owner annotation names t: the same group,
// kind, namespace and name, whatever the version (a rule moved to another
// version of its trigger's kind keeps its children).
func sameTrigger(owner string, t rules.Trigger) bool {
	if owner == t.Owner() { // what every child of t carries, but after a version change
		return true
	}
	o, ok := rules.ParseOwner(owner)
	if !ok {
		return false
	}
	og, _ := schema.ParseGroupVersion(o.APIVersion)
	tg, _ := schema.ParseGroupVersion(t.APIVersion)
	return og.Group == tg.Group && o.Kind == t.Kind && o.Namespace == t.Namespace && o.Name == t.Name
}

// Takeover decides whether the child c of trigger t may be applied over
// existing, the object that holds its name: it returns adopt true when
// existing carries no mark of syncloop's and adoption is allowed — the
// resource says adopt: true, or the object's owner annotated it
// syncloop.dev/adopt: <rule> — nil when existing is already this rule's
// child of t, and a *ConflictError otherwise. An object another rule,
// trigger or installation owns is never taken over.
func Takeover(r *rules.Rule, c Child, t rules.Trigger, existing metav1.Object) (adopt bool, err error) {
	conflict := func(why, hint string) error {
		return &ConflictError{Rule: r.Name, Resource: c.ResourceID, Object: rules.RefOf(c.Object), Why: why, Hint: hint}
	}
	switch OwnershipOf(r, existing, t) {
	case Owned:
		return false, nil
	case Unowned:
		if c.Resource.Adopt || rules.Annotation(existing, rules.AnnotationAdopt) == r.Name {
			return true, nil
		}
		return false, conflict("exists and is not syncloop's",
			fmt.Sprintf("to let syncloop take it over, set adopt: true on the resource or annotate the object %s=%s", rules.AnnotationAdopt, r.Name))
	}
	l := existing.GetLabels()
	switch {
	case l[rules.LabelInstallation] != r.Installation:
		return false, conflict(fmt.Sprintf("belongs to %s", installationName(l[rules.LabelInstallation])), "")
	case l[rules.LabelRule] != "" && l[rules.LabelRule] != r.Name:
		return false, conflict(fmt.Sprintf("is a child of rule %q", l[rules.LabelRule]), "")
	case existing.GetAnnotations()[rules.AnnotationOwner] != "" && l[rules.LabelRule] == r.Name:
		return false, conflict(fmt.Sprintf("is this rule's child of another trigger (%s)", existing.GetAnnotations()[rules.AnnotationOwner]), "")
	}
	return false, conflict("carries another syncloop's ownership labels", "")
}

func installationName(name string) string {
	if name == "" {
		return "the default installation of syncloop"
	}
	return fmt.Sprintf("installation %q of syncloop", name)
}
