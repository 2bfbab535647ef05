package rules

import (
	"fmt"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The resource graph. A resource that reads children.<id> in its when,
// forEach or template depends on resource <id>: it is rendered after it,
// from its live children, and only once they all exist and are ready. The
// edges come from the compiled expressions (expr.Program.ChildRefs), never
// from searching the text, so a reference in a string literal is not one.

// declaredIDs returns the ids written in spec.resources, valid or not, so
// that every resource can be compiled knowing all of them.
func declaredIDs(doc any) []string {
	list, _ := lookup(doc, []any{"spec", "resources"}).([]any)
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
		refs = append(refs, Ref{ID: id, Pos: refPos(d, resolve(n), id, e.Pos)})
	}
	return refs
}

// refPos is the position of the reference to id in the string of n, or
// def when the text does not show it plainly.
func refPos(d *decoder, n *yaml.Node, id string, def Pos) Pos {
	for _, form := range []string{"children." + id, "children.?" + id, "children['" + id, `children["` + id} {
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
	byID := make(map[string]*Resource, len(r.Resources))
	for _, res := range r.Resources {
		byID[res.ID] = res
	}
	for _, res := range r.Resources {
		seen := map[string]bool{}
		for _, ref := range res.Refs {
			dep := byID[ref.ID]
			if dep == nil || seen[ref.ID] {
				continue // unknown ids were load errors already
			}
			seen[ref.ID] = true
			res.Deps = append(res.Deps, dep)
		}
		sort.Slice(res.Deps, func(i, j int) bool { return res.Deps[i].Index < res.Deps[j].Index })
		for _, dep := range res.Deps {
			dep.Dependents = append(dep.Dependents, res)
		}
	}
	found := cycles(r.Resources)
	for _, cycle := range found {
		d.errorAt(refTo(cycle[0], cycle[1%len(cycle)].ID), fmt.Sprintf("spec.resources[%d]", cycle[0].Index),
			"%s", describeCycle(cycle))
	}
	if len(found) > 0 {
		return
	}
	r.Order = topoOrder(r.Resources)
	for i, res := range r.Order {
		res.Rank = i
	}
	r.byID = byID
}

// refTo is where res first reads id.
func refTo(res *Resource, id string) Pos {
	for _, ref := range res.Refs {
		if ref.ID == id {
			return ref.Pos
		}
	}
	return res.Pos
}

// describeCycle names every resource on the cycle and where it reads the
// next one.
func describeCycle(cycle []*Resource) string {
	if len(cycle) == 1 {
		return fmt.Sprintf("dependency cycle: resource %q reads its own children (children.%s at %s)",
			cycle[0].ID, cycle[0].ID, refTo(cycle[0], cycle[0].ID))
	}
	parts := make([]string, len(cycle))
	for i, res := range cycle {
		next := cycle[(i+1)%len(cycle)]
		parts[i] = fmt.Sprintf("%q reads children.%s at %s", res.ID, next.ID, refTo(res, next.ID))
	}
	return "dependency cycle: " + strings.Join(parts, ", ")
}

// cycles returns one cycle through each strongly connected component that
// has one (Tarjan's algorithm), each starting at its resource first in
// spec order, in spec order of those.
func cycles(all []*Resource) [][]*Resource {
	index := map[*Resource]int{}
	low := map[*Resource]int{}
	onStack := map[*Resource]bool{}
	var stack []*Resource
	var comps [][]*Resource
	next := 0
	var visit func(v *Resource)
	visit = func(v *Resource) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range v.Deps {
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
		var comp []*Resource
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[w] = false
			comp = append(comp, w)
			if w == v {
				break
			}
		}
		if len(comp) > 1 || dependsOn(v, v) {
			comps = append(comps, comp)
		}
	}
	for _, v := range all {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	var out [][]*Resource
	for _, comp := range comps {
		out = append(out, cycleIn(comp))
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0].Index < out[j][0].Index })
	return out
}

func dependsOn(a, b *Resource) bool {
	for _, d := range a.Deps {
		if d == b {
			return true
		}
	}
	return false
}

// cycleIn walks a strongly connected component from its first resource in
// spec order along dependencies inside it until it comes back: a cycle
// that names resources the way they read each other.
func cycleIn(comp []*Resource) []*Resource {
	in := map[*Resource]bool{}
	start := comp[0]
	for _, r := range comp {
		in[r] = true
		if r.Index < start.Index {
			start = r
		}
	}
	if len(comp) == 1 {
		return comp
	}
	// Breadth-first from start to find the shortest way back to it.
	prev := map[*Resource]*Resource{}
	queue := []*Resource{start}
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, w := range v.Deps {
			if !in[w] {
				continue
			}
			if w == start {
				var path []*Resource
				for x := v; x != start; x = prev[x] {
					path = append(path, x)
				}
				path = append(path, start)
				for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
					path[i], path[j] = path[j], path[i]
				}
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

// topoOrder orders resources so that each comes after its dependencies;
// among the resources ready to go, the first in spec order goes first, so
// a rule without references keeps its spec order.
func topoOrder(all []*Resource) []*Resource {
	waiting := make(map[*Resource]int, len(all))
	for _, r := range all {
		waiting[r] = len(r.Deps)
	}
	done := make(map[*Resource]bool, len(all))
	out := make([]*Resource, 0, len(all))
	for len(out) < len(all) {
		for _, r := range all {
			if !done[r] && waiting[r] == 0 {
				done[r] = true
				out = append(out, r)
				for _, dep := range r.Dependents {
					waiting[dep]--
				}
				break
			}
		}
	}
	return out
}
