package rules

import (
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/syncloop/syncloop/rules/expr"
)

// APIVersion and Kind of rule documents.
const (
	Group      = "syncloop.dev"
	APIVersion = Group + "/v1alpha1"
	Kind       = "Rule"
)

// DeletionPolicy says what happens to a trigger's children when the trigger
// is deleted or its `when` turns false.
type DeletionPolicy string

const (
	// DeletionDelete deletes the children (the default).
	DeletionDelete DeletionPolicy = "Delete"
	// DeletionOrphan leaves them in place.
	DeletionOrphan DeletionPolicy = "Orphan"
)

// Defaults for the optional fields of a rule's spec. The rate limit defaults
// are those of client-go's DefaultTypedControllerRateLimiter.
const (
	DefaultWorkers      = 64
	DefaultResyncPeriod = 10 * time.Minute
	DefaultBaseDelay    = 5 * time.Millisecond
	DefaultMaxDelay     = 1000 * time.Second
	DefaultQPS          = 10
	DefaultBurst        = 100
	// DefaultRevisionHistoryLimit is as a Deployment's.
	DefaultRevisionHistoryLimit = 10
	maxRevisionHistoryLimit     = 1000
)

// Rule is one loaded, validated and compiled rule. It is immutable: the
// engine and the reload diff share it between goroutines.
type Rule struct {
	Name string
	// Installation is the installation of syncloop the rule acts for
	// (Loader.SetInstallation); empty: the default one.
	Installation string
	// Pos is where the rule's document starts.
	Pos Pos
	Content

	// API, when not nil, is the kind the rule defines (spec.api): Watch
	// is that kind.
	API     *API
	Watch   Watch
	Lookups []*Lookup
	// LookupOrder is Lookups in the order they are read: each after the
	// lookups its namespace, name or selector reads.
	LookupOrder []*Lookup
	Variables   []Variable
	Resources   []*Resource
	// Order is Resources in dependency order: every resource after the
	// resources it reads as children.<id>, otherwise in spec order.
	Order []*Resource
	// Status, when not nil, renders the trigger's .status.
	Status *StatusTemplate

	// Tenant, for a tenant rule (Loader.ForTenant), is the namespace it is
	// confined to; its Name is <Tenant>.<metadata.name>.
	Tenant string
	// Identity is the ServiceAccount the rule acts as
	// (spec.serviceAccountName, or the loader's default); zero: syncloop's
	// own identity.
	Identity ServiceAccount

	RunOptions
}

// Content identifies a rule's content.
type Content struct {
	// Hash: two rules with equal hashes behave the same, wherever their
	// files are.
	Hash string
	// Source is the content, the rule document as JSON: what a revision
	// of the rule stores.
	Source []byte
}

// StatusTemplate renders a trigger's .status.
type StatusTemplate struct {
	*Template
	// Lookups are the lookup ids it reads, itself or through variables.
	Lookups []string
}

// RunOptions say how a rule runs: the deletion policy its resources
// inherit, whether its applies force conflicts, its workers, resync
// period, workqueue rate limit and retries.
type RunOptions struct {
	DeletionPolicy DeletionPolicy
	ForceConflicts bool
	Workers        int
	ResyncPeriod   time.Duration
	RateLimit      RateLimit
	MaxRetries     int
	// RevisionHistoryLimit is how many revisions of the rule are kept in
	// the cluster.
	RevisionHistoryLimit int
	// Rollout says how a change of the rule reaches its triggers.
	Rollout Rollout
	// Teardown says how the children of a deleted trigger go.
	Teardown Teardown
	// RemovalPolicy says what becomes of the rule's children when the
	// rule is removed from the set: DeletionOrphan (the default) leaves
	// them, DeletionDelete deletes them, within Rollout.MaxPrunes.
	RemovalPolicy DeletionPolicy
}

// KindRef is a kind as a rule names it: apiVersion and kind as written,
// and parsed.
type KindRef struct {
	APIVersion string
	Kind       string
	GVK        schema.GroupVersionKind
}

// Watch selects the trigger objects.
type Watch struct {
	KindRef
	Namespace string // empty: all namespaces
	// LabelSelector and FieldSelector are sent to the API server; their
	// String forms are canonical, usable in comparable keys.
	LabelSelector labels.Selector
	FieldSelector fields.Selector
	// When, when not nil, is the predicate (spec.when) a watched object
	// must pass to be a trigger.
	When *Expression
}

// Lookup is an object, or a list of objects, that a rule reads and does
// not own: evaluated per trigger after `when`, before the variables.
type Lookup struct {
	ID string
	KindRef
	// Namespace is where the objects are; empty: the trigger's namespace
	// for a lookup by name of a namespaced kind, all namespaces for a list.
	Namespace Text
	// Name, when set, makes the lookup one object (or null); otherwise it
	// is a list, sorted by namespace and name.
	Name Text
	// LabelSelector selects a list's objects; empty: all.
	LabelSelector Text
	// Required: while the object is absent (a list: empty), the resources
	// that read the lookup wait — neither applied nor pruned — and the
	// Ready condition says WaitingForLookup<Id>.
	Required bool
	// Related: a kind the rule function's customize function may name
	// (spec.function.customize.kinds), read only as it says: not in
	// LookupOrder, not lookups.<id>.
	Related bool
	// Deps are the lookups this one reads as lookups.<id> in its
	// namespace, name or labelSelector, in spec order; Refs say where.
	Deps []*Lookup
	Refs []Ref
	// Pos is where the lookup was written; Field is spec.lookups[i].
	Pos   Pos
	Field string
	// Index is the lookup's position in Rule.Lookups.
	Index int
}

// List reports whether the lookup gives a list rather than one object.
func (l *Lookup) List() bool { return l.Name.Empty() }

// Text is a string field of a rule that is literal or a ${} template over
// the trigger (in a lookup, also over the lookups it reads).
type Text struct {
	Literal  string
	Template *Template // nil: Literal
}

// Empty reports whether the field was not set (or set to "").
func (t Text) Empty() bool { return t.Template == nil && t.Literal == "" }

// IsLiteral reports whether the value is the same for every trigger.
func (t Text) IsLiteral() bool { return t.Template == nil }

// Variable is a named expression, evaluated in order per trigger.
type Variable struct {
	Name string
	Expr *Expression
	// Lookups are the lookup ids the variable reads, itself or through
	// the variables it reads.
	Lookups []string
}

// Resource is one desired child (or, with ForEach, a list of them).
type Resource struct {
	ID string
	// KindRef is the template's kind; zero when the template computes it
	// (Computed).
	KindRef
	// Kinds are the kinds the resource may render: its KindRef, or those
	// spec.resources[].kinds lists for a computed one.
	Kinds   []KindRef
	When    *Expression // nil: always
	ForEach *Expression // nil: one child
	// Clusters, when set, puts the children in the clusters it selects,
	// one set per cluster; nil: in syncloop's own.
	Clusters *Clusters
	// Template renders the child; or else Function computes the children.
	Template *Template
	Function *Function
	// Mode is ModeOwn (the default) or ModePatch.
	Mode Mode
	Literals
	// ReadyWhen must all hold on a live child for it to be ready; none:
	// ready once it exists.
	ReadyWhen []*Expression
	Lifecycle
	ResourceGraph
	// Index is the resource's position in spec.resources; Pos is where it
	// was written.
	Index int
	Pos   Pos
}

// Literals are what a resource's template says of its children's place
// without ${}: nothing for a function's.
type Literals struct {
	// LiteralName and LiteralNamespace are the template's metadata.name and
	// metadata.namespace when they hold no ${}; empty otherwise.
	LiteralName, LiteralNamespace string
	// NoNamespace: the template sets no metadata.namespace, so a
	// namespaced child is in its trigger's namespace.
	NoNamespace bool
}

// Lifecycle is how a resource's children are taken, written and let go.
type Lifecycle struct {
	// DeletionPolicy is the resource's own, or else the rule's.
	DeletionPolicy DeletionPolicy
	// Adopt, the resource's own or else the rule's, lets syncloop take
	// over an object under a child's name that carries no syncloop
	// ownership (render.Takeover).
	Adopt    bool
	adoptSet bool
	// CreateOnce, the resource's own or else the rule's, makes each child
	// once: created when absent, never updated, and not created again
	// once deleted while the trigger still renders it (Kyverno's
	// synchronize: false). The trigger remembers the children made in
	// an annotation (CreatedOnceKey).
	CreateOnce    bool
	createOnceSet bool
}

// ResourceGraph is where a resource sits in its rule's graph.
type ResourceGraph struct {
	// Deps are the resources this one reads as children.<id> in its when,
	// forEach or template, in spec order; Refs say where it reads them.
	Deps []*Resource
	Refs []Ref
	// Dependents are the resources that read this one.
	Dependents []*Resource
	// Lookups are the lookup ids the resource's when, forEach and
	// template read, themselves or through variables.
	Lookups []string
	// Rank is the resource's position in Rule.Order.
	Rank int
	// Wave is when an ordered teardown deletes the resource's children: 0
	// when no resource reads them, otherwise one after the latest wave of
	// the resources that do (Rule.OrdersTeardown).
	Wave int
}

// Resource returns the rule's resource with this id, or nil (a child whose
// resource was removed from the rule).
func (r *Rule) Resource(id string) *Resource {
	for _, res := range r.Resources {
		if res.ID == id {
			return res
		}
	}
	return nil
}

// Ref is one children.<id> reference in a resource, and where it is.
type Ref struct {
	ID  string
	Pos Pos
}

// Mode says whether syncloop owns a resource's objects or patches objects
// it does not own.
type Mode string

const (
	// ModeOwn: syncloop creates the child, labels it as its own, repairs
	// and prunes it.
	ModeOwn Mode = "own"
	// ModePatch: syncloop server-side applies the template's fields onto an
	// existing object it does not own — never creating or deleting it,
	// adding no labels, annotations or ownerReferences — and releases those
	// fields when the resource is no longer desired.
	ModePatch Mode = "patch"
)

// Expression is a compiled CEL expression and where it was written.
type Expression struct {
	*expr.Program
	Pos   Pos
	Field string // e.g. spec.resources[1].forEach
}

// Template is a compiled ${} template and where its strings were written.
type Template struct {
	*expr.Template
	Pos   Pos
	Field string // e.g. spec.resources[0].template
	// prefix is the template's path in its document; positions are keyed by
	// full document paths.
	prefix    expr.Path
	positions map[string]Pos
}

// PosOf returns where the string at path p (relative to the template) was
// written, or the template's own position.
func (t *Template) PosOf(p expr.Path) Pos {
	full := append(append(expr.Path(nil), t.prefix...), p...)
	for len(full) >= len(t.prefix) {
		if pos, ok := t.positions[posKey(full, false)]; ok {
			return pos
		}
		if len(full) == 0 {
			break
		}
		full = full[:len(full)-1]
	}
	return t.Pos
}

// RateLimit configures a rule's workqueue: per-item exponential backoff from
// BaseDelay to MaxDelay, and an overall token bucket of QPS and Burst.
type RateLimit struct {
	BaseDelay time.Duration
	MaxDelay  time.Duration
	QPS       float64
	Burst     int
}

// ReadsLive reports whether rendering reads res's live children: for the
// status, a readyWhen, or resources that depend on it.
func (r *Rule) ReadsLive(res *Resource) bool {
	return r.Status != nil || len(res.ReadyWhen) > 0 || len(res.Dependents) > 0 || res.CreateOnce
}
