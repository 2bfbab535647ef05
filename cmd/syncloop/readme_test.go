package main

import (
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/internal/webhook"
)

// TestDocsCommandLine: the command list of docs/cli.md names every
// command cobra has (help aside) and nothing else, and each command's line
// names exactly its flags (help and the logging flags aside).
func TestDocsCommandLine(t *testing.T) {
	_, block, _ := strings.Cut(docSection(t, "cli.md", "Command line"), "```\n")
	block, _, _ = strings.Cut(block, "```")

	// Each command's text: its line and the indented lines after it.
	// A command of subcommands is shown with one: `syncloop rollout status`.
	texts := map[string]string{}
	sub := map[string]string{}
	var cur string
	for _, line := range strings.Split(block, "\n") {
		if rest, ok := strings.CutPrefix(line, "syncloop "); ok {
			fields := strings.Fields(rest)
			cur = fields[0]
			texts[cur] = ""
			if len(fields) > 1 && !strings.HasPrefix(fields[1], "-") && strings.ToLower(fields[1]) == fields[1] && !strings.ContainsAny(fields[1], "[|#") {
				sub[cur] = fields[1]
			}
		}
		if cur != "" {
			code, _, _ := strings.Cut(line, "#") // comments may name flags in passing
			texts[cur] += code + "\n"
		}
	}
	root := newRootCommand()
	root.InitDefaultCompletionCmd()
	var want []string
	for _, c := range root.Commands() {
		if !c.Hidden && c.Name() != "help" {
			want = append(want, c.Name())
		}
	}
	var got []string
	for name := range texts {
		got = append(got, name)
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Fatalf("docs/cli.md commands %v, cobra's %v", got, want)
	}

	flagRE := regexp.MustCompile(`(?:^|[\s\[])(--?[a-z][a-z-]*)`)
	for _, name := range want {
		path := []string{name}
		if s, ok := sub[name]; ok {
			path = append(path, s)
		}
		cmd, _, err := root.Find(path)
		if err != nil {
			t.Fatal(err)
		}
		var documented []string
		for _, m := range flagRE.FindAllStringSubmatch(texts[name], -1) {
			documented = append(documented, m[1])
		}
		var have []string
		cmd.Flags().VisitAll(func(f *pflag.Flag) { have = append(have, "--"+f.Name) })
		cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) { have = append(have, "--"+f.Name) })
		for _, d := range documented {
			long := d
			if !strings.HasPrefix(d, "--") {
				if f := cmd.Flags().ShorthandLookup(d[1:]); f != nil {
					long = "--" + f.Name
				} else if f := cmd.InheritedFlags().ShorthandLookup(d[1:]); f != nil {
					long = "--" + f.Name
				}
			}
			if !slices.Contains(have, long) {
				t.Errorf("docs/cli.md: syncloop %s %s: no such flag", name, d)
			}
		}
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden || f.Name == "help" || slices.Contains(loggingFlags, f.Name) {
				return
			}
			if !slices.Contains(documented, "--"+f.Name) && !slices.Contains(documented, "-"+f.Shorthand) {
				t.Errorf("docs/cli.md: syncloop %s does not show --%s", name, f.Name)
			}
		})
	}
}

// docSection is the text of the section "## heading" of docs/file, up to
// the next one.
func docSection(t *testing.T, file, heading string) string {
	t.Helper()
	data, err := os.ReadFile("../../docs/" + file)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("docs/%s has no %s section", file, heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

// loggingFlags are klog's, shown once as -v N.
var loggingFlags = []string{"v", "vmodule"}

// TestCompletion: the completion scripts the README tells users to source.
func TestCompletion(t *testing.T) {
	for shell, marker := range map[string]string{"bash": "__start_syncloop", "zsh": "#compdef syncloop", "fish": "complete -c syncloop"} {
		code, out, errOut := syncloop(t, "completion", shell)
		if code != 0 || !strings.Contains(out, marker) {
			t.Errorf("completion %s: exit %d, %d bytes without %q; stderr %q", shell, code, len(out), marker, errOut)
		}
	}
}

// describing is a prometheus.Registerer that records the names of what is
// registered with it.
type describing struct{ names []string }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return nil
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describing) Unregister(prometheus.Collector) bool { return true }

// TestDocsMetrics: the metrics section of docs/seeing.md names every
// metric syncloop registers (the Go and process collectors aside) and no
// other.
func TestDocsMetrics(t *testing.T) {
	section := docSection(t, "seeing.md", "Metrics")
	var documented []string
	for _, m := range regexp.MustCompile("`((?:syncloop|workqueue|rest_client)_[a-z_]+)").FindAllStringSubmatch(section, -1) {
		if !slices.Contains(documented, m[1]) {
			documented = append(documented, m[1])
		}
	}
	reg := &describing{}
	metrics.New(reg, func() int { return 0 }, func() []metrics.RuleReady { return nil }, metrics.Known{})
	metrics.NewShard(reg, func() map[string]int { return nil }, func() map[string]int { return nil })
	metrics.NewRollouts(reg, func() []metrics.Rollout { return nil })
	metrics.NewFleet(reg, func() int { return 0 }, func() int { return 0 }, func() map[string]bool { return nil })
	metrics.NewConversions(reg, webhook.Refusals)
	// The Go runtime and process collectors are named as such.
	own := slices.DeleteFunc(reg.names, func(n string) bool { return strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") })
	registered := slices.Compact(slices.Sorted(slices.Values(own)))
	if len(registered) < 15 {
		t.Fatalf("only %d metrics registered: %v", len(registered), registered)
	}
	sort.Strings(documented)
	if !slices.Equal(documented, registered) {
		t.Errorf("docs/seeing.md metrics %v\nregistered       %v", documented, registered)
	}
}
