package rules

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// AnnotationAdopt, put on an object by its owner with a rule's name as the
// value, lets that rule take the object over although the rule does not
// say adopt: true.
const AnnotationAdopt = Group + "/adopt"

// ConflictError is a child that is not applied because an object syncloop
// may not write holds its name: an object without syncloop's ownership
// (unless adoption allows it), another rule's or trigger's child, or the
// object one of the trigger's lookups reads. Nothing is written to it; the
// trigger's other resources proceed and the resources that read this one
// wait.
type ConflictError struct {
	Rule     string
	Resource string
	Object   ObjectRef
	// Why says whose the object is; Hint, when not empty, what would
	// allow the takeover.
	Why  string
	Hint string
}

func (e *ConflictError) Error() string {
	s := fmt.Sprintf("resource %q: %s %s", e.Resource, e.Object.Kind, e.Object.namespacedName())
	s += " " + e.Why + ": not taking it over"
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// namespacedName is "<namespace>/<name>", or the name of a cluster-scoped
// object.
func (r ObjectRef) namespacedName() string {
	if r.Namespace == "" {
		return r.Name
	}
	return r.Namespace + "/" + r.Name
}

// OnlyConflicts reports whether err is made of ConflictErrors alone
// (errors.Join of them, at any depth): a trigger whose only trouble is
// conflicts.
func OnlyConflicts(err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs := j.Unwrap()
		for _, e := range errs {
			if !OnlyConflicts(e) {
				return false
			}
		}
		return len(errs) > 0
	}
	var c *ConflictError
	return errors.As(err, &c)
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
func (r *Rule) OwnershipOf(obj *unstructured.Unstructured, t Trigger) Ownership {
	l, ann := obj.GetLabels(), obj.GetAnnotations()
	owner, hasOwner := ann[AnnotationOwner]
	if l[LabelManagedBy] != ManagedByValue && l[LabelRule] == "" && !hasOwner {
		return Unowned
	}
	if l[LabelManagedBy] == ManagedByValue && l[LabelRule] == r.Name && sameTrigger(owner, t) && l[LabelInstallation] == r.Installation {
		return Owned
	}
	return OwnedElsewhere
}

// sameTrigger reports whether an owner annotation names t: the same group,
// kind, namespace and name, whatever the version (a rule moved to another
// version of its trigger's kind keeps its children).
func sameTrigger(owner string, t Trigger) bool {
	if owner == t.String() { // what every child of t carries, but after a version change
		return true
	}
	o, ok := ParseTrigger(owner)
	if !ok {
		return false
	}
	og, _ := schema.ParseGroupVersion(o.APIVersion)
	tg, _ := schema.ParseGroupVersion(t.APIVersion)
	return og.Group == tg.Group && o.Kind == t.Kind && o.Namespace == t.Namespace && o.Name == t.Name
}

// ParseTrigger parses a syncloop.dev/owner annotation,
// "<apiVersion>/<kind>/<namespace>/<name>" (apiVersion may hold a slash).
func ParseTrigger(s string) (Trigger, bool) {
	parts := strings.Split(s, "/")
	switch len(parts) {
	case 4:
		return Trigger{APIVersion: parts[0], Kind: parts[1], Namespace: parts[2], Name: parts[3]}, true
	case 5:
		return Trigger{APIVersion: parts[0] + "/" + parts[1], Kind: parts[2], Namespace: parts[3], Name: parts[4]}, true
	}
	return Trigger{}, false
}

// Takeover decides whether the child c of trigger t may be applied over
// existing, the object that holds its name: it returns adopt true when
// existing carries no mark of syncloop's and adoption is allowed — the
// resource says adopt: true, or the object's owner annotated it
// syncloop.dev/adopt: <rule> — nil when existing is already this rule's
// child of t, and a *ConflictError otherwise. An object another rule,
// trigger or installation owns is never taken over.
func (r *Rule) Takeover(c Child, t Trigger, existing *unstructured.Unstructured) (adopt bool, err error) {
	conflict := func(why, hint string) error {
		return &ConflictError{Rule: r.Name, Resource: c.ResourceID, Object: RefOf(c.Object), Why: why, Hint: hint}
	}
	switch r.OwnershipOf(existing, t) {
	case Owned:
		return false, nil
	case Unowned:
		if c.Resource.Adopt || existing.GetAnnotations()[AnnotationAdopt] == r.Name {
			return true, nil
		}
		return false, conflict("exists and is not syncloop's",
			fmt.Sprintf("to let syncloop take it over, set adopt: true on the resource or annotate the object %s=%s", AnnotationAdopt, r.Name))
	}
	l := existing.GetLabels()
	switch {
	case l[LabelInstallation] != r.Installation:
		return false, conflict(fmt.Sprintf("belongs to %s", installationName(l[LabelInstallation])), "")
	case l[LabelRule] != "" && l[LabelRule] != r.Name:
		return false, conflict(fmt.Sprintf("is a child of rule %q", l[LabelRule]), "")
	case existing.GetAnnotations()[AnnotationOwner] != "" && l[LabelRule] == r.Name:
		return false, conflict(fmt.Sprintf("is this rule's child of another trigger (%s)", existing.GetAnnotations()[AnnotationOwner]), "")
	}
	return false, conflict("carries another syncloop's ownership labels", "")
}

func installationName(name string) string {
	if name == "" {
		return "the default installation of syncloop"
	}
	return fmt.Sprintf("installation %q of syncloop", name)
}

// FieldManager is the field manager of the rule's applies and status:
// syncloop/<rule>, or syncloop@<installation>/<rule> in a named
// installation. Its patches' managers add /<trigger digest>.
func (r *Rule) FieldManager() string {
	if r.Installation == "" {
		return FieldManagerPrefix + r.Name
	}
	return "syncloop@" + r.Installation + "/" + r.Name
}

// IsPatchManager reports whether manager names the patches of some rule
// of some installation: syncloop[@<installation>]/<rule>/<trigger digest>.
func IsPatchManager(manager string) bool {
	rest, ok := strings.CutPrefix(manager, FieldManagerPrefix)
	if !ok {
		var named bool
		if rest, named = strings.CutPrefix(manager, "syncloop@"); !named {
			return false
		}
		if _, rest, ok = strings.Cut(rest, "/"); !ok {
			return false
		}
	}
	return strings.Count(rest, "/") == 1
}
