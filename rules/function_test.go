package rules

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// unreachableModule is the smallest WASI command: _start executes
// unreachable. Enough to load; the function package runs real ones.
var unreachableModule = []byte{0, 'a', 's', 'm', 1, 0, 0, 0,
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00, 0x03, 0x02, 0x01, 0x00,
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00,
	0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b}

// functionResource is a resource list whose second resource, fn, is the
// function fields (lines from 12 on: the first resource is lines 7-11).
func functionResource(fields string) string {
	return "  resources:\n    - id: cm\n      template:\n        apiVersion: v1\n        kind: ConfigMap\n        metadata: {name: x, namespace: ns}\n    - id: fn\n" + fields
}

// TestFunctionDecoding: a resource's function loads its module from
// beside the rule file, names its digest in the rule's source, depends
// on the resources it reads; every mistake is an error at its line.
func TestFunctionDecoding(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fn.wasm"), unreachableModule, 0o644); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(unreachableModule)
	zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "fn.wasm.gz"), gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(unreachableModule)
	digest := hex.EncodeToString(sum[:])
	kinds := "      kinds: [{apiVersion: v1, kind: ConfigMap}]\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"valid", kinds + "      function: {wasm: fn.wasm, reads: [cm], timeout: 5s}\n", ""},
		{"gzipped", kinds + "      function: {wasm: fn.wasm.gz, sha256: " + digest + "}\n", ""},
		{"no kinds", "      function: {wasm: fn.wasm}\n",
			`r.yaml:15:7: rule "r": spec.resources[1].kinds: required: list every kind the function may return`},
		{"template and function", kinds + "      function: {wasm: fn.wasm}\n      template: {apiVersion: v1, kind: ConfigMap, metadata: {name: y}}\n",
			`r.yaml:17:17: rule "r": spec.resources[1].function: a resource has a template or a function, not both`},
		{"forEach", kinds + "      forEach: \"['a']\"\n      function: {wasm: fn.wasm}\n",
			`r.yaml:17:16: rule "r": spec.resources[1].forEach: a function returns a list of children itself: leave forEach out`},
		{"no module", kinds + "      function: {timeout: 1s}\n",
			`r.yaml:17:17: rule "r": spec.resources[1].function.wasm: required (or webhook): the module's file`},
		{"missing module", kinds + "      function: {wasm: nope.wasm}\n",
			`r.yaml:17:24: rule "r": spec.resources[1].function.wasm: reading the module: stat nope.wasm: no such file`},
		{"a directory", kinds + "      function: {wasm: ../fn.wasm}\n",
			`r.yaml:17:24: rule "r": spec.resources[1].function.wasm: "../fn.wasm": name a file beside the rule file (no directories)`},
		{"not a module", kinds + "      function: {wasm: junk.wasm}\n",
			`junk.wasm: not a WebAssembly module wazero can compile`},
		{"another digest", kinds + "      function: {wasm: fn.wasm, sha256: '" + strings.Repeat("0", 64) + "'}\n",
			`has sha256 ` + digest + `, not the 0000000000000000000000000000000000000000000000000000000000000000 the rule names`},
		{"reads itself", kinds + "      function: {wasm: fn.wasm, reads: [fn]}\n",
			`r.yaml:17:41: rule "r": spec.resources[1].function.reads[0]: a resource cannot read its own children`},
		{"reads no such", kinds + "      function: {wasm: fn.wasm, reads: [nope]}\n",
			`r.yaml:17:41: rule "r": spec.resources[1].function.reads[0]: no resource "nope" in spec.resources`},
		{"timeout too long", kinds + "      function: {wasm: fn.wasm, timeout: 2m}\n",
			`r.yaml:17:42: rule "r": spec.resources[1].function.timeout: must be more than 0 and at most 1m0s`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := newLoader(t).Parse(filepath.Join(dir, "r.yaml"), []byte(head+watchNS+functionResource(tc.yaml)))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				r := f.Rules[0]
				fn := r.Resources[1].Function
				if fn == nil || fn.Digest != digest || !strings.Contains(string(r.Source), `"sha256":"`+digest+`"`) {
					t.Fatalf("function %+v, source %s: want the module's digest in both", fn, r.Source)
				}
				if deps := r.Resources[1].Deps; tc.name == "valid" && (len(deps) != 1 || deps[0].ID != "cm") {
					t.Errorf("deps %v, want cm (read)", deps)
				}
				return
			}
			got := ""
			if err != nil {
				got = strings.ReplaceAll(err.Error(), dir+"/", "")
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}

	// A tenant rule cannot load a module.
	tl, err := newLoader(t).ForTenant("team")
	if err != nil {
		t.Fatal(err)
	}
	tenantRule := head + "  watch: {apiVersion: v1, kind: ConfigMap}\n" + functionResource(kinds+"      function: {wasm: fn.wasm}\n")
	if _, err := tl.Parse(filepath.Join(dir, "r.yaml"), []byte(tenantRule)); err == nil || !strings.Contains(err.Error(), "a tenant rule cannot call code") {
		t.Errorf("a tenant rule's function: %v", err)
	}

	// From a revision, the module is found by its digest among those
	// loaded; without it, the revision cannot run.
	l := newLoader(t)
	f, err := l.Parse(filepath.Join(dir, "r.yaml"), []byte(head+watchNS+functionResource(kinds+"      function: {wasm: fn.wasm}\n")))
	if err != nil {
		t.Fatal(err)
	}
	src := f.Rules[0].Source
	if _, err := l.ForRevisions().Parse("revision r-1", src); err != nil {
		t.Errorf("the revision of a loaded module: %v", err)
	}
	other := strings.Replace(string(src), digest, strings.Repeat("1", 64), 1)
	if _, err := l.ForRevisions().Parse("revision r-2", []byte(other)); err == nil || !strings.Contains(err.Error(), "is not loaded in this process: the revision cannot run without it") {
		t.Errorf("the revision of a module not loaded: %v", err)
	}
	// For inspection (trace), it compiles: its function cannot run.
	f, err = newLoader(t).ForInspection().Parse("revision r-2", []byte(other))
	if err != nil || f.Rules[0].Resources[1].Function.Module != nil {
		t.Errorf("inspecting the revision of a module not loaded: %v", err)
	}
}
