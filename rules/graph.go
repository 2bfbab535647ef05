package rules

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The resource graph. A resource that reads children.<id> in its when,
// forEach or template depends on resource <id>: it is rendered after it,
// from its live children, and only once they all exist and are ready. The
// edges come from the compiled expressions (expr.Program.ChildRefs), never
// from searching the text, so a reference in a string literal is not one.

// declaredIDs returns the ids written in spec.<field> (resources,
// lookups), valid or not, so that every expression can be compiled knowing
// all of them.
func declaredIDs(doc any, field string) []string {
	list, _ := lookup(doc, []any{"spec", field}).([]any)
	var ids []string
	for _, r := range list {
		m, _ := r.(map[string]any)
		if id, ok := m["id"].(string); ok && id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// exprRefs returns the children.<id> references of a compiled expression,
// each placed where the text shows it.
func (d *decoder) exprRefs(n *yaml.Node, e *Expression) []Ref {
	if e == nil {
		return nil
	}
	var refs []Ref
	for _, id := range e.ChildRefs() {
		refs = append(refs, Ref{ID: id, Pos: refPos(d, resolve(n), "children", id, e.Pos)})
	}
	return refs
}

// refPos is the position of the reference to id through via (children,
// lookups) in the string of n, or def when the text does not show it
// plainly.
func refPos(d *decoder, n *yaml.Node, via, id string, def Pos) Pos {
	for _, form := range []string{via + "." + id, via + ".?" + id, via + "['" + id, via + `["` + id} {
		if i := strings.Index(n.Value, form); i >= 0 {
			return d.offsetPos(n, i)
		}
	}
	return def
}

// graph links the rule's resources by their references, orders them, and
// reports every cycle: a resource reading itself, or resources reading
// each other around a loop. It runs only on a rule whose resources all
// decoded.
func (d *decoder) graph(r *Rule) {
	linkDeps(r.Resources, func(res *Resource, deps []*Resource) {
		res.Deps = deps
		for _, dep := range deps {
			dep.Dependents = append(dep.Dependents, res)
		}
	})
	field := func(res *Resource) string { return fmt.Sprintf("spec.resources[%d]", res.Index) }
	if reportCycles(d, r.Resources, field, "resource", "children", func(res *Resource) Pos { return res.Pos }) {
		return
	}
	r.Order = topoOrder(r.Resources)
	for i, res := range r.Order {
		res.Rank = i
	}
	r.setWaves()
}

// node is what the graph functions need of a resource or a lookup: its
// id, its dependencies, where it reads them, and its spec position.
type node[N any] interface {
	comparable
	nodeID() string
	edges() []N
	refs() []Ref
	order() int
}

func (l *Lookup) nodeID() string   { return l.ID }
func (l *Lookup) edges() []*Lookup { return l.Deps }
func (l *Lookup) refs() []Ref      { return l.Refs }
func (l *Lookup) order() int       { return l.Index }

func (r *Resource) nodeID() string     { return r.ID }
func (r *Resource) edges() []*Resource { return r.Deps }
func (r *Resource) refs() []Ref        { return r.Refs }
func (r *Resource) order() int         { return r.Index }

// linkDeps sets each of nodes' dependencies — the nodes its refs name,
// once each, in spec order — with set.
func linkDeps[N node[N]](nodes []N, set func(n N, deps []N)) {
	byID := make(map[string]N, len(nodes))
	for _, n := range nodes {
		byID[n.nodeID()] = n
	}
	for _, n := range nodes {
		var deps []N
		for _, ref := range n.refs() {
			if dep, ok := byID[ref.ID]; ok && !slices.Contains(deps, dep) { // unknown ids were load errors already
				deps = append(deps, dep)
			}
		}
		slices.SortFunc(deps, func(a, b N) int { return a.order() - b.order() })
		set(n, deps)
	}
}

// reportCycles reports every cycle among nodes (what they are, read via
// what), each at the field of its first node where it reads the next;
// true when there is one.
func reportCycles[N node[N]](d *decoder, nodes []N, field func(N) string, what, via string, pos func(N) Pos) bool {
	found := cycles(nodes)
	for _, cycle := range found {
		d.errorAt(refTo(cycle[0], cycle[1%len(cycle)].nodeID(), pos(cycle[0])), field(cycle[0]), "%s", describeCycle(cycle, what, via, pos))
	}
	return len(found) > 0
}

// refTo is where n first reads id.
func refTo[N node[N]](n N, id string, def Pos) Pos {
	for _, ref := range n.refs() {
		if ref.ID == id {
			return ref.Pos
		}
	}
	return def
}

// describeCycle names every resource (or lookup: what is "resource" or
// "lookup", via "children" or "lookups", how they are read) on the cycle
// and where it reads the next one; pos is where each was written.
func describeCycle[N node[N]](cycle []N, what, via string, pos func(N) Pos) string {
	if len(cycle) == 1 {
		itself := "itself"
		if via == "children" {
			itself = "its own children"
		}
		return fmt.Sprintf("dependency cycle: %s %q reads %s (%s.%s at %s)",
			what, cycle[0].nodeID(), itself, via, cycle[0].nodeID(), refTo(cycle[0], cycle[0].nodeID(), pos(cycle[0])))
	}
	parts := make([]string, len(cycle))
	for i, n := range cycle {
		next := cycle[(i+1)%len(cycle)]
		parts[i] = fmt.Sprintf("%q reads %s.%s at %s", n.nodeID(), via, next.nodeID(), refTo(n, next.nodeID(), pos(n)))
	}
	return "dependency cycle: " + strings.Join(parts, ", ")
}

// cycles returns one cycle through each strongly connected component that
// has one (Tarjan's algorithm), each starting at its node first in spec
// order, in spec order of those.
func cycles[N node[N]](all []N) [][]N {
	index := map[N]int{}
	low := map[N]int{}
	onStack := map[N]bool{}
	var stack []N
	var comps [][]N
	next := 0
	var visit func(v N)
	visit = func(v N) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range v.edges() {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] != index[v] {
			return
		}
		var comp []N
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if len(comp) > 1 || slices.Contains(v.edges(), v) {
			comps = append(comps, comp)
		}
	}
	for _, v := range all {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	var out [][]N
	for _, comp := range comps {
		out = append(out, cycleIn(comp))
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0].order() < out[j][0].order() })
	return out
}

// cycleIn walks a strongly connected component from its first node in
// spec order along dependencies inside it until it comes back: a cycle
// that names nodes the way they read each other.
func cycleIn[N node[N]](comp []N) []N {
	in := map[N]bool{}
	start := comp[0]
	for _, n := range comp {
		in[n] = true
		if n.order() < start.order() {
			start = n
		}
	}
	if len(comp) == 1 {
		return comp
	}
	// Breadth-first from start to find the shortest way back to it.
	prev := map[N]N{}
	queue := []N{start}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, w := range v.edges() {
			if !in[w] {
				continue
			}
			if w == start {
				var path []N
				for x := v; x != start; x = prev[x] {
					path = append(path, x)
				}
				path = append(path, start)
				slices.Reverse(path)
				return path
			}
			if _, seen := prev[w]; !seen {
				prev[w] = v
				queue = append(queue, w)
			}
		}
	}
	return comp
}

// topoOrder orders nodes so that each comes after its dependencies; among
// the nodes ready to go, the first in spec order goes first, so a rule
// without references keeps its spec order. There must be no cycle.
func topoOrder[N node[N]](all []N) []N {
	waiting := make(map[N]int, len(all))
	dependents := make(map[N][]N, len(all))
	for _, n := range all {
		waiting[n] = len(n.edges())
		for _, dep := range n.edges() {
			dependents[dep] = append(dependents[dep], n)
		}
	}
	done := make(map[N]bool, len(all))
	out := make([]N, 0, len(all))
	for len(out) < len(all) {
		for _, n := range all {
			if !done[n] && waiting[n] == 0 {
				done[n] = true
				out = append(out, n)
				for _, dep := range dependents[n] {
					waiting[dep]--
				}
				break
			}
		}
	}
	return out
}
