package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/syncloop/syncloop/rules"
)

var update = flag.Bool("update", false, "rewrite golden files and the render output in examples' READMEs")

// syncloop runs the command line in-process and returns its exit code and
// output.
func syncloop(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

const examplesDir = "../../examples"

// exampleArgs are the render arguments of an example folder: its rules, and
// its CRDs and sample objects.
func exampleArgs(dir string) []string {
	args := []string{"render", "-f", filepath.Join(dir, "rules.yaml")}
	if _, err := os.Stat(filepath.Join(dir, "crd.yaml")); err == nil {
		args = append(args, "--objects", filepath.Join(dir, "crd.yaml"))
	}
	args = append(args, "--objects", filepath.Join(dir, "objects.yaml"))
	// A webhook is not called offline: the example's test records it.
	if test, err := os.ReadFile(filepath.Join(dir, "test.yaml")); err == nil && strings.Contains(string(test), "\nresponses:") {
		args = append(args, "--responses", filepath.Join(dir, "test.yaml"))
	}
	return args
}

func exampleDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(examplesDir)
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	if len(dirs) < 4 {
		t.Fatalf("found %d examples, want at least 4", len(dirs))
	}
	return dirs
}

func TestValidateExamples(t *testing.T) {
	code, out, errOut := syncloop(t, "validate", "-f", examplesDir)
	if code != 0 {
		t.Fatalf("validate -f examples exited %d: %s", code, errOut)
	}
	if !regexp.MustCompile(`^\d+ rule\(s\) in \d+ file\(s\) valid`).MatchString(out) {
		t.Errorf("validate printed %q", out)
	}
}

// TestRenderExamples renders every example, compares YAML and JSON output
// with golden files, and checks that the example's README shows the YAML
// output between its render markers. -update rewrites both.
func TestRenderExamples(t *testing.T) {
	for _, name := range exampleDirs(t) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(examplesDir, name)
			args := exampleArgs(dir)
			code, yamlOut, errOut := syncloop(t, args...)
			if code != 0 {
				t.Fatalf("render exited %d: %s", code, errOut)
			}
			code, jsonOut, errOut := syncloop(t, append(args, "-o", "json")...)
			if code != 0 {
				t.Fatalf("render -o json exited %d: %s", code, errOut)
			}
			checkJSONShape(t, jsonOut)
			golden(t, filepath.Join("testdata", "examples", name+".yaml"), yamlOut)
			golden(t, filepath.Join("testdata", "examples", name+".json"), jsonOut)
			readmeBlock(t, filepath.Join(dir, "README.md"), "render-output", "yaml", yamlOut)
		})
	}
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/syncloop -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test ./cmd/syncloop -update rewrites it):\n%s", path, diffLines(string(want), got))
	}
}

// readmeBlock checks that the README at path shows output in the fenced
// block of lang after the marker <!-- name -->; -update rewrites it.
func readmeBlock(t *testing.T, path, name, lang, output string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)(<!-- " + regexp.QuoteMeta(name) + " -->\n```" + lang + "\n)(.*?)(```\n)")
	m := block.FindSubmatchIndex(data)
	if m == nil {
		t.Fatalf("%s has no <!-- %s --> %s block", path, name, lang)
	}
	if *update {
		updated := string(data[:m[4]]) + output + string(data[m[5]:])
		if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := string(data[m[4]:m[5]]); got != output {
		t.Errorf("%s shows a stale %s (go test ./cmd/syncloop -update rewrites it):\n%s", path, name, diffLines(output, got))
	}
}

// checkJSONShape checks render -o json against the README's shape:
// {"results":[{"rule","trigger":{apiVersion,kind,namespace,name},"children":[…],"status":{…}}]}.
func checkJSONShape(t *testing.T, out string) {
	t.Helper()
	var doc struct {
		Results []map[string]json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("render -o json is not JSON: %v", err)
	}
	if len(doc.Results) == 0 {
		t.Fatal("render -o json has no results")
	}
	for _, r := range doc.Results {
		var trig map[string]string
		if err := json.Unmarshal(r["trigger"], &trig); err != nil {
			t.Fatalf("trigger: %v", err)
		}
		for _, k := range []string{"apiVersion", "kind", "namespace", "name"} {
			if _, ok := trig[k]; !ok {
				t.Errorf("trigger lacks %q: %s", k, r["trigger"])
			}
		}
		if _, ok := r["rule"]; !ok {
			t.Errorf("result lacks rule: %v", r)
		}
		_, skipped := r["skipped"]
		_, children := r["children"]
		_, patches := r["patches"]
		_, clusters := r["clusters"]
		if !children && !patches && !clusters && !skipped {
			t.Errorf("result has neither children, patches nor children in clusters, and is not skipped: %s", r)
		}
	}
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return "first difference at line " + strconv.Itoa(i+1) + ":\n- " + wl + "\n+ " + gl
		}
	}
	return "(same lines)"
}

func TestValidateTypo(t *testing.T) {
	dir := t.TempDir()
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata:
  name: tenant-defaults
spec:
  watch:
    apiVersion: v1
    kind: Namespace
  when: "objet.metadata.labels.tenant != 'system'"
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: y}}
`
	path, code, out, errOut := validateRule(t, dir, rule)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	want := path + `:9:10: rule "tenant-defaults": spec.when: undeclared reference to 'objet'`
	if !strings.HasPrefix(errOut, want+"\n") {
		t.Errorf("stderr = %q\nwant it to start with %q", errOut, want)
	}
	if out != "" {
		t.Errorf("stdout = %q, want nothing", out)
	}
}

// TestValidateWarnsRequired: a template lacking a required field of its
// kind is valid — defaulting or admission may set it — with a warning
// that names the place.
func TestValidateWarnsRequired(t *testing.T) {
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: w}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: d
      template:
        apiVersion: apps/v1
        kind: Deployment
        metadata: {name: d, namespace: x}
        spec:
          template: {spec: {containers: [{name: a, image: nginx}]}}
`
	path, code, out, errOut := validateRule(t, t.TempDir(), rule)
	if code != 0 || !strings.HasPrefix(out, "1 rule(s) in 1 file(s) valid") {
		t.Fatalf("exit %d, stdout %q: want 0 and valid", code, out)
	}
	want := path + `:12:9: rule "w": spec.resources[0].template.spec: warning: missing required field "selector" (unless defaulting or admission sets it)` + "\n"
	if errOut != want {
		t.Errorf("stderr = %q\nwant %q", errOut, want)
	}
}

// TestValidateNotesUntypedKinds: a kind with no schema is dyn to
// expressions; -v=2 says so, the default level does not.
func TestValidateNotesUntypedKinds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: u}
spec:
  watch: {apiVersion: example.com/v1, kind: Thing}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${object.spec.anything}", namespace: x}}
`
	if err := os.WriteFile(path, []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	note := path + `:1:1: rule "u": spec.watch: note: example.com/v1 Thing has no schema (not built in, no CRD given): expressions read it as dyn and its templates are not checked` + "\n"
	code, _, errOut := syncloop(t, "validate", "-v=2", "-f", path)
	if code != 0 || errOut != note {
		t.Errorf("-v=2: exit %d, stderr %q\nwant 0, %q", code, errOut, note)
	}
	// The level is process-wide: this also puts it back.
	code, _, errOut = syncloop(t, "validate", "-v=0", "-f", path)
	if code != 0 || errOut != "" {
		t.Errorf("-v=0: exit %d, stderr %q; want 0 and nothing", code, errOut)
	}
}

// TestValidateCycle: resources that read each other are rejected at load,
// with every resource on the cycle and where it reads the next.
func TestValidateCycle(t *testing.T) {
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: loop}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: a
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${children.b.metadata.name}-a", namespace: x}}
    - id: b
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${children.a.metadata.name}-b", namespace: x}}
`
	path, code, _, errOut := validateRule(t, t.TempDir(), rule)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	want := fmt.Sprintf(`%[1]s:8:71: rule "loop": spec.resources[0]: dependency cycle: "a" reads children.b at %[1]s:8:71, "b" reads children.a at %[1]s:10:71`, path)
	if !strings.HasPrefix(errOut, want+"\n") {
		t.Errorf("stderr = %q\nwant it to start with %q", errOut, want)
	}
}

// validateRule writes rule to dir/rules.yaml and runs validate on it.
func validateRule(t *testing.T, dir, rule string) (path string, code int, stdout, stderr string) {
	t.Helper()
	path = filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte(rule), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = syncloop(t, "validate", "-f", path)
	return path, code, stdout, stderr
}

func TestRenderFailureExitCode(t *testing.T) {
	dir := t.TempDir()
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: r}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: "${dyn(object).spec.missing}", namespace: y}}
`
	objs := "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n"
	rp, op := filepath.Join(dir, "r.yaml"), filepath.Join(dir, "o.yaml")
	os.WriteFile(rp, []byte(rule), 0o644)
	os.WriteFile(op, []byte(objs), 0o644)

	code, out, errOut := syncloop(t, "render", "-f", rp, "--objects", op, "-o", "json")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	var doc struct {
		Results []struct {
			Error string `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Results) != 2 || !strings.Contains(doc.Results[0].Error, "no such key: spec") {
		t.Errorf("results = %+v", doc.Results)
	}
	if strings.Count(errOut, "no such key: spec") != 2 {
		t.Errorf("stderr = %q, want both errors", errOut)
	}

	code, _, errOut = syncloop(t, "render", "-f", rp, "--objects", op, "-o", "xml")
	if code != 1 || !strings.Contains(errOut, "--output must be yaml or json") {
		t.Errorf("-o xml: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = syncloop(t, "render", "-f", rp, "--objects", op, "--rule", "nope")
	if code != 1 || !strings.Contains(errOut, `no rule named "nope"`) {
		t.Errorf("--rule nope: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = syncloop(t, "validate")
	if code != 1 || !strings.Contains(errOut, `required flag(s) "rules" not set`) {
		t.Errorf("validate without -f: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = syncloop(t, "run", "-f", rp, "--leader-elect", "--sharding")
	if code != 1 || !strings.Contains(errOut, "--leader-elect and --sharding are exclusive") {
		t.Errorf("run --leader-elect --sharding: exit %d, stderr %q", code, errOut)
	}
}

func TestRenderFieldSelectorNotEvaluated(t *testing.T) {
	dir := t.TempDir()
	rule := `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: r}
spec:
  watch: {apiVersion: v1, kind: Namespace, fieldSelector: "metadata.name!=b,status.phase=Active"}
  resources:
    - id: cm
      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: x, namespace: "${object.metadata.name}"}}
`
	objs := "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n"
	rp, op := filepath.Join(dir, "r.yaml"), filepath.Join(dir, "o.yaml")
	os.WriteFile(rp, []byte(rule), 0o644)
	os.WriteFile(op, []byte(objs), 0o644)
	code, out, errOut := syncloop(t, "render", "-f", rp, "--objects", op)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "trigger: v1 Namespace a") || strings.Contains(out, "trigger: v1 Namespace b") {
		t.Errorf("metadata.name!=b not applied offline:\n%s", out)
	}
	if !strings.Contains(errOut, `field selector status.phase=Active not evaluated offline`) {
		t.Errorf("stderr = %q, want the not-evaluated requirement reported", errOut)
	}
}

// TestRenderInstallation: render --installation shows the children as that
// installation makes them, labelled with its name; a name that is no label
// value is refused.
func TestRenderInstallation(t *testing.T) {
	args := exampleArgs(filepath.Join(examplesDir, "tenant-defaults"))
	code, out, errOut := syncloop(t, append(args, "-o", "json", "--installation", "team-a")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if n := strings.Count(out, `"`+rules.LabelInstallation+`": "team-a"`); n == 0 {
		t.Errorf("no child labelled %s=team-a:\n%s", rules.LabelInstallation, out)
	}
	code, out, _ = syncloop(t, append(args, "-o", "json")...)
	if code != 0 || strings.Contains(out, rules.LabelInstallation) {
		t.Errorf("the default installation's children carry %s (exit %d)", rules.LabelInstallation, code)
	}
	if code, _, errOut := syncloop(t, append(args, "--installation", "Team_A")...); code != 1 || !strings.Contains(errOut, `installation "Team_A"`) {
		t.Errorf("--installation Team_A: exit %d, stderr %q", code, errOut)
	}
}

// TestCRDsCommand: syncloop crds prints, as YAML, the CRD of every kind
// the rules define — the app example's is the golden file's, and the API
// server takes it (TestAPIRuleServed) — and nothing for rules that define
// none; validate -v=2 notes a status field the CRD types as any value.
func TestCRDsCommand(t *testing.T) {
	code, out, errOut := syncloop(t, "crds", "-f", filepath.Join(examplesDir, "app"))
	if code != 0 || !strings.HasPrefix(out, "# The kind rule app defines (") {
		t.Fatalf("crds: exit %d\n%s%s", code, out, errOut)
	}
	golden(t, filepath.Join("testdata", "crds-app.yaml"), out[strings.Index(out, "\n")+1:])
	if code, out, _ := syncloop(t, "crds", "-f", filepath.Join(examplesDir, "tenant-defaults")); code != 0 || out != "" {
		t.Errorf("crds of rules that define no kind: exit %d, %q", code, out)
	}
	dir := t.TempDir()
	rule := writeFile(t, dir, "dyn.yaml", `apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: dyn}
spec:
  api:
    apiVersion: example.com/v1
    kind: Thing
    spec: {size: integer}
  status:
    size: ${object.spec.size}
    anything: ${dyn(object.spec).size}
`)
	code, _, errOut = syncloop(t, "validate", "-v=2", "-f", rule)
	if code != 0 || !strings.Contains(errOut, `dyn.yaml:11:15: rule "dyn": spec.status.anything: note: the CRD types status.anything as any value`) || strings.Contains(errOut, "status.size") {
		t.Errorf("validate -v=2: exit %d, stderr %s", code, errOut)
	}
}

// TestRunCompression: `run` asks for uncompressed answers unless
// --api-compression is given, whatever the kubeconfig.
func TestRunCompression(t *testing.T) {
	kubeconfig := unreachableKubeconfig(t)
	for _, tc := range []struct {
		args []string
		want bool // DisableCompression
	}{{nil, true}, {[]string{"--api-compression"}, false}, {[]string{"--api-compression=false"}, true}} {
		var f runFlags
		cmd := &cobra.Command{Use: "run"}
		f.register(cmd)
		if err := cmd.ParseFlags(append([]string{"-f", "rules.yaml", "--kubeconfig", kubeconfig}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		o, err := f.options(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if o.Config.DisableCompression != tc.want {
			t.Errorf("run %v: DisableCompression %v, want %v", tc.args, o.Config.DisableCompression, tc.want)
		}
	}
}

// TestRunWebhookClientCA: --webhook-client-ca is refused unless the
// webhook is served here, and reaches the manager when it is.
func TestRunWebhookClientCA(t *testing.T) {
	kubeconfig := unreachableKubeconfig(t)
	for _, tc := range []struct {
		args    []string
		wantErr bool
	}{{[]string{"--webhook-client-ca", "ca.crt"}, true}, {[]string{"--webhook-client-ca", "ca.crt", "--webhook-bind-address", ":9443"}, false}} {
		var f runFlags
		cmd := &cobra.Command{Use: "run"}
		f.register(cmd)
		if err := cmd.ParseFlags(append([]string{"-f", "rules.yaml", "--kubeconfig", kubeconfig}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		o, err := f.options(cmd)
		if (err != nil) != tc.wantErr || (err == nil && o.CRDs.ClientCA != "ca.crt") {
			t.Errorf("run %v: %v, client CA %q; want an error %v", tc.args, err, o.CRDs.ClientCA, tc.wantErr)
		}
	}
}

// TestValidateVersions: validate says, for a kind of several versions,
// which is stored, which is the hub, which the rule reads and which are
// deprecated.
func TestValidateVersions(t *testing.T) {
	code, out, errOut := syncloop(t, "validate", "-f", "../../examples/app")
	want := "rule app: App (apps.example.syncloop.dev) in versions v1 (stored, hub, read by the rule), v1alpha1 (deprecated), converted by syncloop's webhook (syncloop crds prints the CRD)\n"
	if code != 0 || !strings.HasSuffix(out, want) {
		t.Errorf("exit %d, stdout %q, stderr %q: want it to end with %q", code, out, errOut, want)
	}
}

// unreachableKubeconfig writes a kubeconfig whose server does not answer:
// for tests of what flags make of it, before any request.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return kubeconfig
}
