// Package diagram draws a compiled rule as a graph: its trigger, lookups,
// resources and status, linked by the references their compiled
// expressions make (children.<id>, lookups.<id>, through variables too),
// with what decides whether a child is made or ready (when, forEach,
// readyWhen, required) written on the nodes and edges. It writes Mermaid
// (which GitHub renders in Markdown) and Graphviz dot.
//
// It reads only the loaded rules; it knows nothing of clusters, and
// nothing here renders or evaluates an expression.
package diagram

import (
	"fmt"
	"strings"

	"github.com/syncloop/syncloop/rules"
)

// Shape is what a node stands for, and so how it is drawn.
type Shape int

const (
	// Trigger is the watched kind (or the kind the rule defines).
	Trigger Shape = iota
	// Lookup is an object or list the rule reads and does not own.
	Lookup
	// Child is a resource whose objects syncloop owns.
	Child
	// Patch is a resource that patches objects syncloop does not own.
	Patch
	// Status is the trigger's status the rule writes.
	Status
)

// Node is one box of the graph.
type Node struct {
	// ID is unique in its graph and safe in Mermaid and dot.
	ID    string
	Shape Shape
	// Title is the node's first line; Lines follow it.
	Title string
	Lines []string
	// Many: a forEach or function resource, or a list lookup, drawn as a
	// collection.
	Many bool
	// Conditional: a when may leave the node out.
	Conditional bool
	// Required: a lookup whose absence holds back what reads it.
	Required bool
}

// Edge says that To reads From, through Via (children.<id>,
// lookups.<id>), or is rendered from the trigger (Via empty).
type Edge struct {
	From, To string
	Via      string
	// Waits: To waits for From — a required lookup present, a child
	// existing and ready.
	Waits bool
}

// Graph is one rule drawn.
type Graph struct {
	Rule  string
	Nodes []Node
	Edges []Edge
}

// maxExpr is how much of an expression a node shows.
const maxExpr = 60

// Of draws rule r; prefix keeps node ids apart when several rules share a
// picture.
func Of(r *rules.Rule, prefix string) *Graph {
	g := &Graph{Rule: r.Name}
	trigger := prefix + "trigger"
	g.Nodes = append(g.Nodes, triggerNode(r, trigger))
	lookupID := func(id string) string { return prefix + "lookup_" + sanitize(id) }
	childID := func(id string) string { return prefix + "res_" + sanitize(id) }
	required := map[string]bool{}
	for _, l := range r.Lookups {
		required[l.ID] = l.Required
		g.Nodes = append(g.Nodes, lookupNode(l, lookupID(l.ID)))
		if len(l.Deps) == 0 {
			g.Edges = append(g.Edges, Edge{From: trigger, To: lookupID(l.ID)})
		}
		for _, dep := range l.Deps {
			g.Edges = append(g.Edges, Edge{From: lookupID(dep.ID), To: lookupID(l.ID), Via: "lookups." + dep.ID, Waits: dep.Required})
		}
	}
	for _, res := range r.Resources {
		g.Nodes = append(g.Nodes, resourceNode(res, childID(res.ID)))
		if len(res.Deps) == 0 {
			g.Edges = append(g.Edges, Edge{From: trigger, To: childID(res.ID)})
		}
		for _, id := range res.Lookups {
			g.Edges = append(g.Edges, Edge{From: lookupID(id), To: childID(res.ID), Via: "lookups." + id, Waits: required[id]})
		}
		if res.Function != nil && res.Function.Customize != nil {
			for _, l := range res.Function.Customize.Related {
				g.Edges = append(g.Edges, Edge{From: lookupID(l.ID), To: childID(res.ID), Via: "related"})
			}
		}
		for _, dep := range res.Deps {
			g.Edges = append(g.Edges, Edge{From: childID(dep.ID), To: childID(res.ID), Via: "children." + dep.ID, Waits: true})
		}
	}
	if r.WritesStatus() {
		g.addStatus(r, prefix+"status", lookupID, childID)
	}
	return g
}

// addStatus adds the trigger's status and what it reads.
func (g *Graph) addStatus(r *rules.Rule, id string, lookupID, childID func(string) string) {
	g.Nodes = append(g.Nodes, Node{ID: id, Shape: Status, Title: "status", Lines: []string{r.Watch.Kind + " .status"}})
	seen := map[string]bool{}
	if sync := r.Sync(); sync != nil { // the function returns it
		seen[sync.ID] = true
		g.Edges = append(g.Edges, Edge{From: childID(sync.ID), To: id, Via: "its status"})
	}
	var lookups []string
	if r.Status != nil {
		for _, ref := range r.Status.ChildRefs() {
			if !seen[ref.ID] {
				seen[ref.ID] = true
				g.Edges = append(g.Edges, Edge{From: childID(ref.ID), To: id, Via: "children." + ref.ID})
			}
		}
		lookups = r.Status.Lookups
	}
	for _, l := range lookups {
		g.Edges = append(g.Edges, Edge{From: lookupID(l), To: id, Via: "lookups." + l})
	}
	if len(seen) == 0 && len(lookups) == 0 {
		g.Edges = append(g.Edges, Edge{From: g.Nodes[0].ID, To: id})
	}
}

func triggerNode(r *rules.Rule, id string) Node {
	n := Node{ID: id, Shape: Trigger, Title: r.Watch.Kind, Lines: []string{r.Watch.APIVersion}}
	if r.API != nil {
		n.Lines = append(n.Lines, "defined by rule "+r.Name)
	} else {
		n.Lines = append(n.Lines, "rule "+r.Name)
	}
	if r.Watch.Namespace != "" {
		n.Lines = append(n.Lines, "namespace "+r.Watch.Namespace)
	}
	if s := r.Watch.LabelSelector; s != nil && !s.Empty() {
		n.Lines = append(n.Lines, "labels "+s.String())
	}
	if s := r.Watch.FieldSelector; s != nil && !s.Empty() {
		n.Lines = append(n.Lines, "fields "+s.String())
	}
	if r.Watch.When != nil {
		n.Lines = append(n.Lines, "when "+clip(r.Watch.When.Source()))
	}
	return n
}

func lookupNode(l *rules.Lookup, id string) Node {
	n := Node{ID: id, Shape: Lookup, Title: "lookup " + l.ID, Lines: []string{kindLine(l.KindRef)}, Many: l.List(), Required: l.Required}
	switch {
	case l.Related:
		n.Title = "related " + l.Kind
		n.Lines = append(n.Lines, "as customize names")
	case !l.List():
		n.Lines = append(n.Lines, "one by name")
	case l.LabelSelector.Empty():
		n.Lines = append(n.Lines, "list")
	default:
		n.Lines = append(n.Lines, "list by labels")
	}
	if l.Required {
		n.Lines = append(n.Lines, "required")
	}
	return n
}

func resourceNode(res *rules.Resource, id string) Node {
	n := Node{ID: id, Shape: Child, Title: res.ID, Many: res.Many(), Conditional: res.When != nil}
	var kinds []string
	for _, k := range res.Kinds {
		kinds = append(kinds, kindLine(k))
	}
	n.Lines = append(n.Lines, strings.Join(kinds, " or "))
	if res.Mode == rules.ModePatch {
		n.Shape = Patch
		n.Lines = append(n.Lines, "patches, does not own")
	}
	if cl := res.Clusters; cl != nil {
		n.Lines = append(n.Lines, "in clusters "+clip(clustersLine(cl)))
	}
	if res.ForEach != nil {
		n.Lines = append(n.Lines, "forEach "+clip(res.ForEach.Source()))
	}
	if fn := res.Function; fn != nil {
		switch {
		case fn.Sync && fn.Webhook != nil:
			n.Lines = append(n.Lines, "the rule's function: sync hook", clip(fn.Webhook.URL))
		case fn.Sync:
			n.Lines = append(n.Lines, "the rule's function: "+fn.Wasm)
		case fn.Webhook != nil:
			n.Lines = append(n.Lines, "webhook "+clip(fn.Webhook.URL))
		default:
			n.Lines = append(n.Lines, "function "+fn.Wasm)
		}
	}
	if res.When != nil {
		n.Lines = append(n.Lines, "when "+clip(res.When.Source()))
	}
	for _, e := range res.ReadyWhen {
		n.Lines = append(n.Lines, "readyWhen "+clip(e.Source()))
	}
	if res.CreateOnce {
		n.Lines = append(n.Lines, "created once")
	}
	if res.DeletionPolicy == rules.DeletionOrphan {
		n.Lines = append(n.Lines, "orphaned when no longer desired")
	}
	return n
}

// kindLine is a kind as a node shows it: Kind group/version.
func kindLine(k rules.KindRef) string { return fmt.Sprintf("%s %s", k.Kind, k.APIVersion) }

// clip shortens an expression to one line of at most maxExpr runes.
func clip(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > maxExpr {
		return string(r[:maxExpr-1]) + "…"
	}
	return s
}

// sanitize makes an id safe as a Mermaid or dot node id.
func sanitize(id string) string {
	var b strings.Builder
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
			b.WriteRune(c)
		default:
			fmt.Fprintf(&b, "_%x_", c)
		}
	}
	return b.String()
}

// clustersLine says which clusters a resource's children go to: its
// selector, or its names.
func clustersLine(cl *rules.Clusters) string {
	if cl.Selector != nil {
		return cl.Selector.Source()
	}
	names := make([]string, len(cl.Names))
	for i, t := range cl.Names {
		names[i] = t.Literal
		if !t.IsLiteral() {
			names[i] = "${…}" // one per trigger
		}
	}
	return strings.Join(names, ", ")
}
