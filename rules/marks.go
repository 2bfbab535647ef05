package rules

import "strings"

// Every label, annotation, finalizer and field manager syncloop writes is
// named here: on children, on triggers, on revisions, on shard Leases and
// on the ConfigMaps of tenant rules.

// Labels and annotations syncloop puts on every child (docs/safety.md,
// "Writing only what it owns"). A template may not set them.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "syncloop"
	LabelRule      = Group + "/rule"
	LabelOwnerUID  = Group + "/owner-uid"
	// LabelInstallation names the installation of syncloop a child
	// belongs to; the default installation's children carry none.
	LabelInstallation    = Group + "/installation"
	AnnotationOwner      = Group + "/owner"
	AnnotationResourceID = Group + "/resource-id"
	// AnnotationAppliedHash holds a hash of the child as syncloop last
	// applied it. A child whose hash matches and whose fields hold what
	// the rule wants is not applied again: no write in steady state. A
	// changed template — including a removed field, which comparing
	// fields cannot see — changes the hash.
	AnnotationAppliedHash = Group + "/applied-hash"
)

// AnnotationAdopt, put on an object by its owner with a rule's name as the
// value, lets that rule take the object over although the rule does not
// say adopt: true.
const AnnotationAdopt = Group + "/adopt"

// AnnotationRuleHash, on a revision of a rule, is the rule's Hash: the
// revision's identity.
const AnnotationRuleHash = Group + "/rule-hash"

// AnnotationSourceFile, on a revision of a rule, is the rule file the
// version came from: a syncloop started while that file does not load
// puts the file's newest revisions in force, its last good version.
const AnnotationSourceFile = Group + "/source-file"

// AnnotationLoadedAt, on a revision of a rule, is when the replica that
// recorded it first read the file content the version came from
// (File.LoadedAt, RFC 3339 with nanoseconds): replicas that loaded two
// versions of a file at about the same moment order them by it, not by
// which recording came in last.
const AnnotationLoadedAt = Group + "/loaded-at"

// createdOncePrefix begins the annotation of a trigger that remembers the
// children a rule's createOnce resources made for it.
const createdOncePrefix = "created-once." + Group + "/"

// CreatedOnceKey is the annotation of a trigger that lists the children
// rule's createOnce resources made for it (one "<resource id>/<namespace>/
// <name>" a line): a child deleted while listed is not created again.
// Its name part is the rule's name, a DNS-1123 label.
func CreatedOnceKey(rule string) string { return createdOncePrefix + rule }

// Field managers: FieldManagerPrefix begins the default installation's.
const FieldManagerPrefix = "syncloop/"

// FieldManagerCRD is the field manager syncloop applies the CRDs of API
// rules with.
const FieldManagerCRD = FieldManagerPrefix + "crds"

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

// teardownDomain is the domain of the teardown finalizers: the prefix of
// the default installation's, the suffix of a named one's.
const teardownDomain = "teardown." + Group

// TeardownFinalizer is the finalizer that holds a trigger of the rule
// until its children are torn down: teardown.syncloop.dev/<rule>, or
// <installation>.teardown.syncloop.dev/<rule> in a named installation.
// A rule's name, a DNS-1123 label (a tenant rule's holds a dot), fits the
// name part of a finalizer; an installation's, a DNS-1123 label too, makes
// its prefix a DNS subdomain.
func (r *Rule) TeardownFinalizer() string {
	if r.Installation == "" {
		return teardownDomain + "/" + r.Name
	}
	return r.Installation + "." + teardownDomain + "/" + r.Name
}

// IsTeardownFinalizer reports whether f is the teardown finalizer of some
// rule of installation ("": the default one).
func IsTeardownFinalizer(f, installation string) bool {
	prefix, _, ok := strings.Cut(f, "/")
	if !ok {
		return false
	}
	if installation == "" {
		return prefix == teardownDomain
	}
	return prefix == installation+"."+teardownDomain
}

// AnnotationRollout, on a revision, holds the record of the rollout to it
// (rollout.Record, JSON).
const AnnotationRollout = Group + "/rollout"

// AnnotationRemoval, on the newest revision of a rule removed from the
// set, holds what its removal did (the engine's RemovalRecord, JSON): a rule's
// removal is done once.
const AnnotationRemoval = Group + "/removal"

// LabelTenantRules marks a ConfigMap whose keys are a team's rule files
// (--tenant-rules): its value must be "true".
const LabelTenantRules = Group + "/rules"

// The labels and annotations of shard Leases.
const (
	// LabelShardGroup names the group a shard Lease belongs to.
	LabelShardGroup = Group + "/shard-group"
	// AnnotationShardView is the view a member works under: the members'
	// names, sorted, comma-separated. A member without it (joining) works
	// on nothing.
	AnnotationShardView = Group + "/shard-view"
)
