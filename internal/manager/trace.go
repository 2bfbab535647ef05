package manager

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/cache"

	"github.com/syncloop/syncloop/engine/rollout"
	"github.com/syncloop/syncloop/rules"
)

// TraceOptions say which trigger Trace follows and where the rules are.
type TraceOptions struct {
	// Resource is the trigger's kind as kubectl takes it (KIND[.GROUP],
	// plural, singular or short name); Name and Namespace the object's.
	Resource, Name, Namespace string
	// Set, when not nil, is the rules to trace with; otherwise the rules'
	// newest revisions recorded in SyncloopNamespace, compiled by
	// Revisions, and for a trigger a rollout has not moved yet, the
	// revision it is still on.
	Set               *rules.Set
	Revisions         *rules.Loader
	SyncloopNamespace string
	Installation      string
	// Events is how many of the trigger's last Events to show.
	Events int
	// Clusters say where the kubeconfig Secrets of the fleet are, read
	// when a rule targets clusters, and what they may do, as run reads
	// them.
	Clusters Clusters
}

// TraceReport is what syncloop did to one trigger and why it waits.
type TraceReport struct {
	Trigger    TraceObject      `json:"trigger"`
	Rules      []RuleTrace      `json:"rules"`
	Conditions []TraceCondition `json:"conditions,omitempty"`
	Status     map[string]any   `json:"status,omitempty"`
	Events     []TraceEvent     `json:"events,omitempty"`
	// Ready: every rule's resources are ready (or excluded).
	Ready bool `json:"ready"`
}

// TraceObject names an object.
type TraceObject struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Namespace  string    `json:"namespace,omitempty"`
	Name       string    `json:"name"`
	UID        string    `json:"uid,omitempty"`
	Created    time.Time `json:"created,omitzero"`
}

// RuleTrace is one rule that matches the trigger.
type RuleTrace struct {
	Rule string `json:"rule"`
	// Revision and Hash are the revision the trigger is on (0: the rules
	// were given, or no revision records them); Rollout where the rollout
	// to the rule's newest revision stands, for this trigger.
	Revision int64  `json:"revision,omitempty"`
	Hash     string `json:"hash"`
	Rollout  string `json:"rollout,omitempty"`
	// Skipped: the rule's when is false for the trigger.
	Skipped bool `json:"skipped,omitempty"`
	// Error is why the rule could not be rendered for the trigger.
	Error     string          `json:"error,omitempty"`
	Lookups   []LookupTrace   `json:"lookups,omitempty"`
	Resources []ResourceTrace `json:"resources,omitempty"`
	// Undesired are children of the rule there that it no longer renders:
	// a running syncloop prunes them (or orphans them, by its
	// deletionPolicy).
	Undesired []ChildTrace `json:"undesired,omitempty"`
	// Ready and Reason are the Ready condition this state earns.
	Ready   bool   `json:"ready"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// LookupTrace is what one lookup resolved to.
type LookupTrace struct {
	ID       string   `json:"id"`
	Kind     string   `json:"kind"`
	Query    string   `json:"query"`
	Required bool     `json:"required,omitempty"`
	Found    []string `json:"found"`
}

// ResourceTrace is one resource of the rule and its children.
type ResourceTrace struct {
	ID string `json:"id"`
	// State is Ready, NotReady, Waiting, Excluded, Conflict or Failed.
	State    string       `json:"state"`
	Why      string       `json:"why,omitempty"`
	Children []ChildTrace `json:"children,omitempty"`
}

// The states of a resource.
const (
	TraceReady    = "Ready"
	TraceNotReady = "NotReady"
	TraceWaiting  = "Waiting"
	TraceExcluded = "Excluded"
	TraceFailed   = "Failed"
	TraceConflict = "Conflict"
)

// ChildTrace is one child as it is in the cluster.
type ChildTrace struct {
	TraceObject
	Resource string `json:"resource,omitempty"`
	// Cluster is the cluster of the fleet the child is in; "": syncloop's
	// own. Unreachable says why it cannot be read there: whether it
	// exists is not known.
	Cluster     string `json:"cluster,omitempty"`
	Unreachable string `json:"unreachable,omitempty"`
	// Held says why the rollout by cluster under way has not brought the
	// revision traced to the child's cluster yet: the child is as the
	// previous revision left it, not compared.
	Held string `json:"held,omitempty"`
	// Exists: the object is there. Synced: it holds every field the rule
	// renders; Drift names the first that differs.
	Exists bool `json:"exists"`
	// AsIs: the rule did not render it now (its resource waits, or wants
	// it no more), so it was not compared.
	AsIs    bool      `json:"asIs,omitempty"`
	Synced  bool      `json:"synced"`
	Drift   string    `json:"drift,omitempty"`
	Updated time.Time `json:"updated,omitzero"`
	// Patch: the rule patches it and does not own it.
	Patch bool `json:"patch,omitempty"`
	// Conflict is the object that holds the child's name and is not
	// syncloop's to write.
	Conflict string `json:"conflict,omitempty"`
}

// TraceCondition is one of the trigger's conditions.
type TraceCondition struct {
	Type    string    `json:"type"`
	Status  string    `json:"status"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since,omitzero"`
}

// TraceEvent is one Event about the trigger.
type TraceEvent struct {
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
	Last    time.Time `json:"last"`
}

// Trace reads one trigger, the rules that match it and what they made of
// it, from the cluster, without syncloop running: GETs of the trigger and
// of each child, the lookups the rules make, a list of each child kind by
// the trigger's labels, and its Events; for a rule that targets clusters,
// the kubeconfig Secrets and the same of each cluster. It lists nothing
// else.
func Trace(ctx context.Context, c *Clients, o TraceOptions) (*TraceReport, error) {
	mapping, err := traceMapping(c, o.Resource)
	if err != nil {
		return nil, err
	}
	res := c.Dynamic.Dynamic.Resource(mapping.Resource)
	var obj *unstructured.Unstructured
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		obj, err = res.Namespace(o.Namespace).Get(ctx, o.Name, metav1.GetOptions{})
	} else {
		obj, err = res.Get(ctx, o.Name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, err
	}
	rep := &TraceReport{Trigger: objectOf(obj), Ready: true}
	rep.Conditions = conditionsOf(obj)
	if status, ok := obj.Object["status"].(map[string]any); ok {
		rep.Status = status
	}
	ruleSet, err := traceRules(ctx, c, o, obj)
	if err != nil {
		return nil, err
	}
	if len(ruleSet) == 0 {
		return rep, fmt.Errorf("no rule of %s matches %s", installationName(o.Installation), describeObject(obj))
	}
	fl, err := traceFleet(ctx, c, o, ruleSet)
	if err != nil {
		return nil, err
	}
	for _, tr := range ruleSet {
		rt := traceRule(ctx, c, tr, obj, fl)
		rep.Ready = rep.Ready && (rt.Ready || rt.Skipped)
		rep.Rules = append(rep.Rules, rt)
	}
	rep.Events, err = traceEvents(ctx, c, obj, o.Events)
	return rep, err
}

// traceMapping resolves a kind as kubectl takes it: KIND[.GROUP], by
// its plural, singular or short name, from the cluster's discovery.
func traceMapping(c *Clients, resource string) (*meta.RESTMapping, error) {
	m := restmapper.NewShortcutExpander(restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Discovery)), c.Discovery, func(string) {})
	gvk, err := m.KindFor(schema.ParseGroupResource(resource).WithVersion(""))
	if err != nil {
		return nil, fmt.Errorf("kind %q: %w", resource, err)
	}
	return m.RESTMapping(gvk.GroupKind(), gvk.Version)
}

// tracedRule is a rule to trace with and the revision the trigger is on;
// moving is the rollout under way to it, if the trigger has moved to it
// (a rollout by cluster keeps it out of the clusters not reached yet).
type tracedRule struct {
	rule     *rules.Rule
	revision int64
	rollout  string
	moving   *rollout.Record
}

// traceRules are the rules that match obj: those given, or the newest
// revision of each rule recorded (the one before, for a trigger a rollout
// has not moved yet).
func traceRules(ctx context.Context, c *Clients, o TraceOptions, obj *unstructured.Unstructured) ([]tracedRule, error) {
	var all []tracedRule
	if o.Set != nil {
		for _, r := range o.Set.Rules() {
			all = append(all, tracedRule{rule: r})
		}
	} else {
		var err error
		if all, err = recordedRules(ctx, c, o, obj); err != nil {
			return nil, err
		}
	}
	var out []tracedRule
	for _, tr := range all {
		w := tr.rule.Watch
		if w.GVK.GroupKind() != obj.GroupVersionKind().GroupKind() {
			continue
		}
		probe := obj.DeepCopy()
		probe.SetAPIVersion(w.APIVersion) // the version the rule reads: matched as the API server would serve it
		if ok, _ := w.MatchesOffline(probe); ok {
			out = append(out, tr)
		}
	}
	return out, nil
}

// recordedRules compiles each rule's revision obj is on.
func recordedRules(ctx context.Context, c *Clients, o TraceOptions, obj *unstructured.Unstructured) ([]tracedRule, error) {
	k := newRevisionKeeper(c, o.SyncloopNamespace, o.Installation)
	list, err := k.store.List(ctx, k.selector())
	if err != nil {
		return nil, fmt.Errorf("the rules' revisions in namespace %s: %w", o.SyncloopNamespace, err)
	}
	byRule := map[string][]int{}
	for i, cr := range list {
		byRule[cr.Labels[rules.LabelRule]] = append(byRule[cr.Labels[rules.LabelRule]], i)
	}
	names := make([]string, 0, len(byRule))
	for name := range byRule {
		names = append(names, name)
	}
	sort.Strings(names)
	compile := compileRevision(o.Revisions)
	var out []tracedRule
	for _, name := range names {
		idx := byRule[name]
		sort.Slice(idx, func(a, b int) bool { return list[idx[a]].Revision > list[idx[b]].Revision })
		newest := list[idx[0]]
		if removalOf(newest) != nil {
			continue // removed from the set
		}
		on, state := newest, ""
		var moving *rollout.Record
		if rec := rolloutOf(newest); rec != nil && rec.State != "" {
			t := rollout.Trigger{Key: cache.MetaObjectToName(obj), Digest: rollout.Digest(name, cache.MetaObjectToName(obj)), Created: obj.GetCreationTimestamp().Time}
			state = fmt.Sprintf("rollout to revision %d %s, step %d of %d", newest.Revision, rec.State, rec.Step, rec.Steps)
			if !rec.Puts(t) {
				for _, i := range idx {
					if list[i].Annotations[rules.AnnotationRuleHash] == rec.From {
						on = list[i]
					}
				}
				state += ": this trigger not moved yet"
			} else {
				state += ": this trigger moved"
				moving = rec
			}
		}
		stub := &rules.Rule{Name: name}
		if ns, _, tenant := strings.Cut(name, "."); tenant { // a tenant rule is <namespace>.<name>
			stub.Tenant = ns
		}
		r, err := compile(stub, on.Name, on.Data.Raw)
		if err != nil {
			return nil, fmt.Errorf("revision %s: %w", on.Name, err)
		}
		out = append(out, tracedRule{rule: r, revision: on.Revision, rollout: state, moving: moving})
	}
	return out, nil
}

// traceEvents are the last n Events about obj, newest last.
func traceEvents(ctx context.Context, c *Clients, obj *unstructured.Unstructured, n int) ([]TraceEvent, error) {
	if n <= 0 {
		return nil, nil
	}
	list, err := c.Core.CoreV1().Events(obj.GetNamespace()).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(obj.GetUID())})
	if apierrors.IsForbidden(err) {
		return nil, nil // Events are a courtesy: a trace without them still says what is there
	}
	if err != nil {
		return nil, err
	}
	var out []TraceEvent
	for _, e := range list.Items {
		last := e.LastTimestamp.Time
		if last.IsZero() {
			last = e.EventTime.Time
		}
		if last.IsZero() {
			last = e.CreationTimestamp.Time
		}
		out = append(out, TraceEvent{Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count, Last: last})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Last.Before(out[j].Last) })
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out, nil
}

func objectOf(obj *unstructured.Unstructured) TraceObject {
	return TraceObject{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Namespace: obj.GetNamespace(), Name: obj.GetName(),
		UID: string(obj.GetUID()), Created: obj.GetCreationTimestamp().Time}
}

// conditionsOf reads obj's status.conditions.
func conditionsOf(obj *unstructured.Unstructured) []TraceCondition {
	list, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	var out []TraceCondition
	for _, item := range list {
		m, _ := item.(map[string]any)
		str := func(k string) string { s, _ := m[k].(string); return s }
		since, _ := time.Parse(time.RFC3339, str("lastTransitionTime"))
		out = append(out, TraceCondition{Type: str("type"), Status: str("status"), Reason: str("reason"), Message: str("message"), Since: since})
	}
	return out
}

func describeObject(obj *unstructured.Unstructured) string {
	if obj.GetNamespace() == "" {
		return fmt.Sprintf("%s %s", obj.GetKind(), obj.GetName())
	}
	return fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
}

func installationName(inst string) string {
	if inst == "" {
		return "the default installation"
	}
	return "installation " + inst
}
