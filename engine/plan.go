package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/pmezard/go-difflib/difflib"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
)

// Plan actions.
const (
	ActionCreate = "create"
	ActionUpdate = "update"
	ActionDelete = "delete"
	ActionStatus = "status"
	// ActionWait is a resource that would not be applied yet: a resource
	// it reads is not ready.
	ActionWait = "wait"
	// ActionAdopt is an update that takes over an object syncloop did not
	// create (adopt: true, or the object's syncloop.dev/adopt annotation).
	ActionAdopt = "adopt"
	// ActionConflict is a child that would not be applied: an object
	// syncloop may not take over holds its name (render.ConflictError).
	ActionConflict = "conflict"
	// ActionMigrate is a CRD whose objects would be moved to its new
	// storage version (read and updated each), then its
	// status.storedVersions trimmed.
	ActionMigrate = "migrate"
)

// Action is one write a dry run would make.
type Action struct {
	Action  string          `json:"action"`
	Rule    string          `json:"rule"`
	Trigger rules.ObjectRef `json:"trigger"`
	Object  rules.ObjectRef `json:"object"`
	// Cluster is the cluster of the fleet the object is in; "": syncloop's
	// own.
	Cluster string `json:"cluster,omitempty"`
	// Diff is a unified diff, live against desired, of the fields syncloop
	// manages (updates and status); Secret values are redacted.
	Diff string `json:"diff,omitempty"`
	// Resource and Reason, for a wait: the resource's id and what it
	// waits for (its object is named as far as the template is literal);
	// for a conflict: the resource's id and whose the object is.
	Resource string `json:"resource,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// Planner receives what a dry run finds. Implementations must be safe for
// concurrent use: every rule's workers call it.
type Planner interface {
	Plan(Action)
	// Failed reports a trigger whose plan could not be computed.
	Failed(rule, trigger string, err error)
	// Rollout reports a transition of a changed rule's rollout (reason,
	// message): a dry run goes through its steps as they would go.
	Rollout(rule, reason, message string)
}

// PlanPrinter prints actions as docs/cli.md's "Dry run and plan" shows
// them: text blocks and a summary line, or one JSON object per line. Safe
// for concurrent use.
type PlanPrinter struct {
	mu      sync.Mutex
	w, errW io.Writer
	json    bool
	stream  bool
	counts  map[string]int
	errors  int
	seen    map[string]string // stream: object → last printed action
	held    map[string]Action // not stream: by rule, action and object; printed, sorted, by Summary
	failed  map[string]bool   // not stream: rule and trigger of the failures printed
}

// NewPlanPrinter prints to w as text, or as JSON lines when jsonLines;
// failures go to errW. A streaming printer prints each action as it comes,
// except one identical to the last printed for the same object (a running
// dry run plans again on every resync). Otherwise actions are held and
// Summary prints them sorted by rule, trigger and object, each write once
// however many times a trigger was planned (one pass may reconcile a
// trigger twice: on its child's event and in the sweep for orphans), and
// each trigger's failure once.
func NewPlanPrinter(w, errW io.Writer, jsonLines, stream bool) *PlanPrinter {
	return &PlanPrinter{w: w, errW: errW, json: jsonLines, stream: stream, counts: map[string]int{},
		seen: map[string]string{}, held: map[string]Action{}, failed: map[string]bool{}}
}

// Plan implements Planner.
func (p *PlanPrinter) Plan(a Action) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := a.Rule + " " + a.Action + " " + a.Object.String() + " " + a.Cluster
	if a.Action == ActionWait {
		key += " " + a.Trigger.String() + " " + a.Resource
	}
	if !p.stream {
		p.held[key] = a
		return
	}
	sum := sha256.Sum256([]byte(a.Diff))
	if p.seen[key] == string(sum[:]) {
		return
	}
	p.seen[key] = string(sum[:])
	p.print(a)
}

func (p *PlanPrinter) print(a Action) {
	p.counts[a.Action]++
	if p.json {
		data, _ := json.Marshal(a)
		fmt.Fprintf(p.w, "%s\n", data)
		return
	}
	sym := map[string]string{ActionCreate: "+", ActionUpdate: "~", ActionAdopt: "~", ActionDelete: "-", ActionStatus: "~",
		ActionWait: "=", ActionConflict: "!", ActionMigrate: ">"}[a.Action]
	object := a.Object.String()
	if a.Action == ActionWait {
		object = fmt.Sprintf("resource %s (%s)", a.Resource, strings.TrimSpace(object))
	}
	if a.Cluster != "" {
		object += " in cluster " + a.Cluster
	}
	head := fmt.Sprintf("%s %-7s %s  (rule %s", sym, a.Action, object, a.Rule)
	if a.Action != ActionStatus && a.Trigger != (rules.ObjectRef{}) {
		head += fmt.Sprintf(", trigger %s", a.Trigger)
	}
	// Names, reasons and diffs hold what the cluster and the rules hold:
	// printed escaped, the diff and the reason indented under their head.
	fmt.Fprintln(p.w, printable.Text(head)+")")
	if a.Reason != "" {
		fmt.Fprintf(p.w, "    %s\n", printable.Block(a.Reason, "    "))
	}
	if a.Diff != "" {
		fmt.Fprintf(p.w, "    %s\n", printable.Block(strings.TrimRight(a.Diff, "\n"), "    "))
	}
}

// Rollout prints a transition of a rule's rollout, when the printer
// streams (run --dry-run); plan says where its rollouts stand itself.
func (p *PlanPrinter) Rollout(rule, reason, message string) {
	if !p.stream {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		data, _ := json.Marshal(map[string]any{"rollout": map[string]string{"rule": rule, "reason": reason, "message": message}})
		fmt.Fprintf(p.w, "%s\n", data)
		return
	}
	fmt.Fprintln(p.w, printable.Text(fmt.Sprintf("Rollout of rule %s: %s: %s", rule, reason, message)))
}

// Failed implements Planner: the error goes to errW.
func (p *PlanPrinter) Failed(rule, trigger string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stream {
		key := rule + " " + trigger
		if p.failed[key] {
			return
		}
		p.failed[key] = true
	}
	p.errors++
	fmt.Fprintln(p.errW, printable.Block(fmt.Sprintf("error: rule %s, trigger %s: %v", rule, trigger, err), "  "))
}

// Summary prints "Plan: N to create, N to update, N to delete, N status
// update(s)." (text only) and reports how many actions and failures there were.
func (p *PlanPrinter) Summary() (actions, failures int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	held := slices.Collect(maps.Values(p.held))
	sort.Slice(held, func(i, j int) bool {
		a, b := held[i], held[j]
		return a.Rule+"\x00"+a.Trigger.String()+"\x00"+a.Object.String()+"\x00"+a.Action <
			b.Rule+"\x00"+b.Trigger.String()+"\x00"+b.Object.String()+"\x00"+b.Action
	})
	for _, a := range held {
		p.print(a)
	}
	clear(p.held)
	for _, n := range p.counts {
		actions += n
	}
	if !p.json {
		status := "status updates"
		if p.counts[ActionStatus] == 1 {
			status = "status update"
		}
		more := ""
		if n := p.counts[ActionAdopt]; n > 0 {
			more += fmt.Sprintf(", %d to adopt", n)
		}
		if n := p.counts[ActionWait]; n > 0 {
			more += fmt.Sprintf(", %d waiting", n)
		}
		if n := p.counts[ActionMigrate]; n > 0 {
			more += fmt.Sprintf(", %d storage migration(s)", n)
		}
		if n := p.counts[ActionConflict]; n == 1 {
			more += ", 1 conflict"
		} else if n > 1 {
			more += fmt.Sprintf(", %d conflicts", n)
		}
		fmt.Fprintf(p.w, "Plan: %d to create, %d to update, %d to delete, %d %s%s.\n",
			p.counts[ActionCreate], p.counts[ActionUpdate], p.counts[ActionDelete], p.counts[ActionStatus], status, more)
	}
	return actions, p.errors
}

// project returns the part of v that shape (a desired object) has: map keys
// shape has, list items by position. It is how a diff is limited to the
// fields syncloop manages.
func project(v, shape any) any {
	switch s := shape.(type) {
	case map[string]any:
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		out := map[string]any{}
		for k, sv := range s {
			if lv, ok := m[k]; ok {
				out[k] = project(lv, sv)
			}
		}
		return out
	case []any:
		l, ok := v.([]any)
		if !ok {
			return v
		}
		out := make([]any, len(l))
		for i := range l {
			if i < len(s) {
				out[i] = project(l[i], s[i])
			} else {
				out[i] = l[i]
			}
		}
		return out
	}
	return v
}

// Diff is the unified diff, live against desired, of the fields desired
// has, Secret values redacted: an update's diff in a plan. gk is
// "Kind.group".
func Diff(gk string, live, desired map[string]any) string {
	return diffObjects(gk, live, desired, desired)
}

// diffObjects is the unified diff, live against desired, of the fields of
// shape, without syncloop's applied-hash and with Secret values redacted.
func diffObjects(gk string, live, desired, shape map[string]any) string {
	a := forDiff(gk, project(live, shape))
	b := forDiff(gk, project(desired, shape))
	return unifiedDiff(a, b)
}

func forDiff(gk string, v any) string {
	if m, ok := v.(map[string]any); ok {
		m = runtimeDeepCopy(m)
		if ann, ok, _ := unstructured.NestedStringMap(m, "metadata", "annotations"); ok {
			delete(ann, rules.AnnotationAppliedHash)
			if len(ann) == 0 {
				unstructured.RemoveNestedField(m, "metadata", "annotations")
			} else {
				_ = unstructured.SetNestedStringMap(m, ann, "metadata", "annotations")
			}
		}
		v = Redact(gk, m)
	}
	out, err := printable.YAML(v) // a value yaml.Marshal refuses would hide the change
	if err != nil {
		return fmt.Sprintf("(cannot show: %v)\n", err)
	}
	return string(out)
}

// Redact returns obj with the values of a Secret's data and stringData
// replaced by a short hash: a change stays visible, the value does not.
// Other kinds are returned as they are. gk is "Kind.group" ("Secret." for
// core Secrets).
func Redact(gk string, obj map[string]any) map[string]any {
	if gk != "Secret." {
		return obj
	}
	obj = runtimeDeepCopy(obj)
	for _, field := range []string{"data", "stringData"} {
		m, ok := obj[field].(map[string]any)
		if !ok {
			continue
		}
		for k, v := range m {
			s, _ := v.(string)
			sum := sha256.Sum256([]byte(s))
			m[k] = "(redacted, sha256:" + hex.EncodeToString(sum[:4]) + ")"
		}
	}
	return obj
}

func runtimeDeepCopy(m map[string]any) map[string]any {
	return (&unstructured.Unstructured{Object: m}).DeepCopy().Object
}

// maxDiffCells bounds what unifiedDiff compares line by line (the matcher
// may take time in the product of the two lengths): two objects of a few
// thousand lines each get a whole-object diff instead.
const maxDiffCells = 4 << 20

// wholeDiff is a valid unified diff of x against y in one hunk that removes
// every line of x and adds every line of y.
func wholeDiff(x, y []string) string {
	var out strings.Builder
	fmt.Fprintf(&out, "--- live\n+++ desired\n@@ -%d,%d +%d,%d @@\n", min(1, len(x)), len(x), min(1, len(y)), len(y))
	for _, l := range x {
		out.WriteString("-" + l + "\n")
	}
	for _, l := range y {
		out.WriteString("+" + l + "\n")
	}
	return out.String()
}

// splitLines is text's lines; none for empty text.
func splitLines(s string) []string {
	if s = strings.TrimRight(s, "\n"); s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// unifiedDiff is a line diff of a against b with three lines of context,
// headed "--- live" / "+++ desired" (hunk ranges as GNU diff writes them);
// empty when their lines are equal. Texts too large to compare line by
// line get one whole-object hunk.
func unifiedDiff(a, b string) string {
	x, y := splitLines(a), splitLines(b)
	if slices.Equal(x, y) {
		return ""
	}
	if len(x)*len(y) > maxDiffCells {
		return wholeDiff(x, y)
	}
	withEOL := func(l []string) []string {
		out := make([]string, len(l))
		for i, s := range l {
			out[i] = s + "\n"
		}
		return out
	}
	d, err := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: withEOL(x), B: withEOL(y), FromFile: "live", ToFile: "desired", Context: 3})
	if err != nil { // writing to a string does not fail
		return wholeDiff(x, y)
	}
	return d
}
