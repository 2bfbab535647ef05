package offline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/syncloop/syncloop/internal/printable"
	"github.com/syncloop/syncloop/rules"
	"github.com/syncloop/syncloop/rules/render"
)

// Result is one (rule, trigger) pair of an offline render.
type Result struct {
	Rule     string           `json:"rule"`
	Trigger  rules.ObjectRef  `json:"trigger"`
	Skipped  bool             `json:"skipped,omitempty"`
	Children []map[string]any `json:"children,omitempty"`
	// Clusters are the children that go to other clusters, by cluster.
	Clusters []ClusterChildren `json:"clusters,omitempty"`
	// Patches are the fields mode: patch resources apply onto objects
	// syncloop does not own.
	Patches []map[string]any `json:"patches,omitempty"`
	Status  map[string]any   `json:"status,omitempty"`
	// Conflicts are children not applied: an object among the objects that
	// the rule may not write holds their name, or a lookup reads them.
	Conflicts []Conflict `json:"conflicts,omitempty"`
	// Notes are what could not be decided without a cluster: a readyWhen
	// that cannot hold on a rendered child, a value only the server sets.
	Notes []string `json:"notes,omitempty"`
	Error string   `json:"error,omitempty"`
}

// ClusterChildren are the children a trigger puts in one cluster of the
// inventory.
type ClusterChildren struct {
	Cluster  string           `json:"cluster"`
	Children []map[string]any `json:"children"`
}

// Conflict is a child an offline render did not apply (render.ConflictError).
type Conflict struct {
	Object  rules.ObjectRef `json:"object"`
	Message string          `json:"message"`
}

// Report is the result of rendering rules against objects without a
// cluster.
type Report struct {
	Results []Result `json:"results"`
	// NotEvaluated lists, per rule, field selector requirements that could
	// not be evaluated offline (objects were matched without them).
	NotEvaluated map[string][]string `json:"-"`
}

// Failed reports whether any result has an error or a conflict.
func (o *Report) Failed() bool {
	for _, r := range o.Results {
		if r.Error != "" || len(r.Conflicts) > 0 {
			return true
		}
	}
	return false
}

// Render renders every rule of set (or only the one named only)
// against every object its watch matches, as `syncloop render` does; the
// rules' webhooks answer with responses, those recorded for them.
// Results come in rule-name order, then in object order.
func Render(ctx context.Context, set *rules.Set, objects []*unstructured.Unstructured, only string, responses ...render.RecordedResponse) (*Report, error) {
	if only != "" && set.Get(only) == nil {
		return nil, fmt.Errorf("no rule named %q", only)
	}
	// The kinds the rules define are defaulted, as the API server
	// would serve them.
	objects = set.Default(objects)
	scope := rules.NewOfflineScope(objects)
	rec := render.Recorded{Objects: objects, Responses: responses}
	out := &Report{NotEvaluated: map[string][]string{}}
	for _, r := range set.Rules() {
		if only != "" && r.Name != only {
			continue
		}
		for _, obj := range objects {
			ok, notEval := r.Watch.MatchesOffline(obj)
			if len(notEval) > 0 && len(out.NotEvaluated[r.Name]) == 0 {
				out.NotEvaluated[r.Name] = notEval
			}
			if !ok {
				continue
			}
			out.Results = append(out.Results, renderOne(ctx, render.Input{Rule: r, Trigger: obj, Scoper: scope, Lookups: rec.Objects, Clusters: rec.Objects, Recorded: rec}))
		}
	}
	return out, nil
}

func renderOne(ctx context.Context, in render.Input) Result {
	res := Result{Rule: in.Rule.Name, Trigger: rules.RefOf(in.Trigger)}
	rd, err := render.Rule(ctx, in)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if rd.Skipped {
		res.Skipped = true
		return res
	}
	conflicted := map[rules.ObjectRef]bool{}
	for _, ce := range rd.Conflicts {
		res.Conflicts = append(res.Conflicts, Conflict{Object: ce.Object, Message: ce.Error()})
		conflicted[ce.Object] = true
	}
	for _, c := range rd.Children {
		switch {
		case conflicted[rules.RefOf(c.Object)]: // not applied: listed as a conflict
		case c.Patch:
			res.Patches = append(res.Patches, c.Object.Object)
		case c.Cluster != "":
			res.addRemote(c.Cluster, c.Object.Object)
		default:
			res.Children = append(res.Children, c.Object.Object)
		}
	}
	res.Notes = rd.Notes
	res.Status, err = rd.Status(ctx)
	if err != nil {
		res.Error = err.Error()
	}
	return res
}

// addRemote lists obj among the children of cluster.
func (r *Result) addRemote(cluster string, obj map[string]any) {
	for i := range r.Clusters {
		if r.Clusters[i].Cluster == cluster {
			r.Clusters[i].Children = append(r.Clusters[i].Children, obj)
			return
		}
	}
	r.Clusters = append(r.Clusters, ClusterChildren{Cluster: cluster, Children: []map[string]any{obj}})
}

// childrenIn are the children the result puts in cluster.
func (r *Result) childrenIn(cluster string) []map[string]any {
	for _, cc := range r.Clusters {
		if cc.Cluster == cluster {
			return cc.Children
		}
	}
	return nil
}

// WriteJSON writes the JSON document docs/cli.md describes: {"results":[…]}.
func (o *Report) WriteJSON(w io.Writer) error {
	if o.Results == nil {
		o.Results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(o)
}

// WriteYAML writes a YAML stream: every child as a document preceded by a
// "# rule: …, trigger: …" comment, every status as a document of the
// trigger preceded by "# status of …". Skipped triggers and errors are
// comments (errors are also the caller's to report).
func (o *Report) WriteYAML(w io.Writer) error {
	var b bytes.Buffer
	for _, r := range o.Results {
		switch {
		case r.Error != "":
			fmt.Fprintln(&b, printable.Text(fmt.Sprintf("# rule: %s, trigger: %s: error: %s", r.Rule, r.Trigger, oneLine(r.Error))))
			continue
		case r.Skipped:
			fmt.Fprintln(&b, printable.Text(fmt.Sprintf("# rule: %s, trigger: %s: skipped (when is false)", r.Rule, r.Trigger)))
			continue
		}
		for _, n := range r.Notes {
			fmt.Fprintln(&b, printable.Text(fmt.Sprintf("# rule: %s, trigger: %s: note: %s", r.Rule, r.Trigger, oneLine(n))))
		}
		for _, c := range r.Conflicts {
			fmt.Fprintln(&b, printable.Text(fmt.Sprintf("# rule: %s, trigger: %s: conflict: %s", r.Rule, r.Trigger, oneLine(c.Message))))
		}
		for _, c := range r.Children {
			if err := writeDoc(&b, fmt.Sprintf("# rule: %s, trigger: %s", r.Rule, r.Trigger), c); err != nil {
				return err
			}
		}
		for _, cc := range r.Clusters {
			for _, c := range cc.Children {
				if err := writeDoc(&b, fmt.Sprintf("# rule: %s, trigger: %s, cluster: %s", r.Rule, r.Trigger, cc.Cluster), c); err != nil {
					return err
				}
			}
		}
		for _, c := range r.Patches {
			if err := writeDoc(&b, fmt.Sprintf("# rule: %s, trigger: %s: patch (fields applied onto an existing object)", r.Rule, r.Trigger), c); err != nil {
				return err
			}
		}
		if r.Status != nil {
			md := map[string]any{"name": r.Trigger.Name}
			if r.Trigger.Namespace != "" {
				md["namespace"] = r.Trigger.Namespace
			}
			doc := map[string]any{"apiVersion": r.Trigger.APIVersion, "kind": r.Trigger.Kind, "metadata": md, "status": r.Status}
			if err := writeDoc(&b, fmt.Sprintf("# status of %s (rule %s)", r.Trigger, r.Rule), doc); err != nil {
				return err
			}
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}

// writeDoc writes v as a YAML document, every string exact (a value
// yaml.Marshal refuses, DEL or a C1 control, fails no render), after
// comment: one line, whatever the names in it hold.
func writeDoc(b *bytes.Buffer, comment string, v any) error {
	y, err := printable.YAML(v)
	if err != nil {
		return err
	}
	b.WriteString("---\n")
	b.WriteString(printable.Text(comment))
	b.WriteByte('\n')
	b.Write(y)
	return nil
}

func oneLine(s string) string {
	return string(bytes.ReplaceAll([]byte(s), []byte("\n"), []byte(" ")))
}
