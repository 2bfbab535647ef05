package diagram

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/syncloop/syncloop/internal/printable"
)

// Mermaid writes graphs as one Mermaid flowchart, each rule in a
// subgraph of its own when there are several. Shapes: the trigger a
// stadium, a lookup a parallelogram, a child a box (a forEach a stacked
// box), a patch a hexagon, the status a flag; a dashed border is a when, a
// thick one a required lookup; a thick edge is one that waits.
func Mermaid(w io.Writer, graphs []*Graph) error {
	b := bufio.NewWriter(w)
	fmt.Fprintln(b, "flowchart LR")
	writeNodes(b, graphs, "  end", func(g *Graph) {
		fmt.Fprintf(b, "  subgraph %s[%s]\n", sanitize("rule_"+g.Rule), mermaidText("rule "+g.Rule))
	}, func(indent string, n Node) {
		fmt.Fprintf(b, "%s%s%s\n", indent, n.ID, mermaidShape(n))
	})
	for _, g := range graphs {
		for _, e := range g.Edges {
			arrow := "-->"
			if e.Waits {
				arrow = "==>"
			}
			if e.Via != "" {
				arrow += "|" + mermaidText(e.Via) + "|"
			}
			fmt.Fprintf(b, "  %s %s %s\n", e.From, arrow, e.To)
		}
	}
	var conditional, required []string
	for _, g := range graphs {
		for _, n := range g.Nodes {
			if n.Conditional {
				conditional = append(conditional, n.ID)
			}
			if n.Required {
				required = append(required, n.ID)
			}
		}
	}
	if len(conditional) > 0 {
		fmt.Fprintf(b, "  classDef conditional stroke-dasharray: 5 5\n  class %s conditional\n", strings.Join(conditional, ","))
	}
	if len(required) > 0 {
		fmt.Fprintf(b, "  classDef required stroke-width:3px\n  class %s required\n", strings.Join(required, ","))
	}
	return b.Flush()
}

// writeNodes writes each graph's nodes with node, in a group of its own
// (begun by open, ended by the line end) when there are several.
func writeNodes(b *bufio.Writer, graphs []*Graph, end string, open func(*Graph), node func(indent string, n Node)) {
	indent := "  "
	for _, g := range graphs {
		if len(graphs) > 1 {
			open(g)
			indent = "    "
		}
		for _, n := range g.Nodes {
			node(indent, n)
		}
		if len(graphs) > 1 {
			fmt.Fprintln(b, end)
		}
	}
}

func mermaidShape(n Node) string {
	text := mermaidText(append([]string{"<b>" + n.Title + "</b>"}, n.Lines...)...)
	switch {
	case n.Shape == Trigger:
		return "([" + text + "])"
	case n.Shape == Lookup:
		return "[/" + text + "/]"
	case n.Shape == Patch:
		return "{{" + text + "}}"
	case n.Shape == Status:
		return ">" + text + "]"
	case n.Many:
		return "[[" + text + "]]"
	}
	return "[" + text + "]"
}

// mermaidText is lines as a quoted Mermaid label: what the rule wrote
// made printable (an expression's string may hold escape sequences that
// a terminal showing the graph would act on), entity codes for what
// Mermaid would read as syntax, <br/> between lines.
func mermaidText(lines ...string) string {
	esc := make([]string, len(lines))
	for i, l := range lines {
		bold := strings.HasPrefix(l, "<b>") && strings.HasSuffix(l, "</b>")
		if bold {
			l = strings.TrimSuffix(strings.TrimPrefix(l, "<b>"), "</b>")
		}
		l = strings.NewReplacer(`"`, "#quot;", "<", "#lt;", ">", "#gt;", "|", "#124;", "#", "#35;").Replace(printable.Text(l))
		if bold {
			l = "<b>" + l + "</b>"
		}
		esc[i] = l
	}
	return `"` + strings.Join(esc, "<br/>") + `"`
}

// Dot writes graphs as one Graphviz digraph, each rule a cluster of its
// own when there are several; shapes and line styles mean what they mean
// in Mermaid.
func Dot(w io.Writer, graphs []*Graph) error {
	b := bufio.NewWriter(w)
	fmt.Fprintln(b, "digraph syncloop {")
	fmt.Fprintln(b, "  rankdir=LR;")
	fmt.Fprintln(b, `  node [fontname="Helvetica", fontsize=11];`)
	fmt.Fprintln(b, `  edge [fontname="Helvetica", fontsize=9];`)
	writeNodes(b, graphs, "  }", func(g *Graph) {
		fmt.Fprintf(b, "  subgraph %s {\n    label=%s;\n", dotID("cluster_"+g.Rule), dotLabel("rule "+g.Rule))
	}, func(indent string, n Node) {
		fmt.Fprintf(b, "%s%s [%s];\n", indent, n.ID, dotAttrs(n))
	})
	for _, g := range graphs {
		for _, e := range g.Edges {
			var attrs []string
			if e.Via != "" {
				attrs = append(attrs, "label="+dotLabel(e.Via))
			}
			if e.Waits {
				attrs = append(attrs, "style=bold")
			}
			if len(attrs) > 0 {
				fmt.Fprintf(b, "  %s -> %s [%s];\n", e.From, e.To, strings.Join(attrs, ", "))
			} else {
				fmt.Fprintf(b, "  %s -> %s;\n", e.From, e.To)
			}
		}
	}
	fmt.Fprintln(b, "}")
	return b.Flush()
}

func dotAttrs(n Node) string {
	shape := map[Shape]string{Trigger: "ellipse", Lookup: "parallelogram", Child: "box", Patch: "hexagon", Status: "cds"}[n.Shape]
	attrs := []string{"shape=" + shape, "label=" + dotLabel(append([]string{n.Title}, n.Lines...)...)}
	var styles []string
	if n.Conditional {
		styles = append(styles, "dashed")
	}
	if n.Required {
		styles = append(styles, "bold")
	}
	if len(styles) > 0 {
		attrs = append(attrs, "style="+dotQuote(strings.Join(styles, ",")))
	}
	if n.Many {
		attrs = append(attrs, "peripheries=2")
	}
	return strings.Join(attrs, ", ")
}

// dotLabel is lines as a dot label: each made printable, as in
// mermaidText, one under the other.
func dotLabel(lines ...string) string {
	esc := make([]string, len(lines))
	for i, l := range lines {
		esc[i] = printable.Text(l)
	}
	return dotQuote(strings.Join(esc, "\n"))
}

// dotQuote is s as a dot string.
func dotQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// dotID is s as a dot id.
func dotID(s string) string { return sanitize(s) }
