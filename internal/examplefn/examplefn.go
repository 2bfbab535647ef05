// Package examplefn builds the examples' function steps: each
// examples/<name>/function is a Go program that examples/<name>/rules.yaml
// calls as <name>.wasm.gz, compiled here for WebAssembly (GOOS=wasip1
// GOARCH=wasm) and gzipped, so that the chart's rules ConfigMap (1 MiB at
// most) holds it — the repository holds no binaries. `make functions`, the
// demo and the tests that load the examples build them.
package examplefn

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build compiles every example's function under examplesDir into its
// module (Go's build cache makes a build of unchanged sources quick), and
// writes the module only when it differs: a syncloop watching the
// directory reloads nothing for nothing.
func Build(examplesDir string) error {
	dirs, err := filepath.Glob(filepath.Join(examplesDir, "*", "function"))
	if err != nil {
		return err
	}
	for _, src := range dirs {
		example := filepath.Dir(src)
		out := filepath.Join(example, filepath.Base(example)+".wasm.gz")
		if err := build(src, out); err != nil {
			return err
		}
	}
	return nil
}

// build compiles the Go program in src for WebAssembly into out, gzipped.
func build(src, out string) error {
	tmp, err := os.MkdirTemp("", "examplefn-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	wasm := filepath.Join(tmp, "module.wasm")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", wasm, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if got, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s for WebAssembly: %v\n%s", src, err, got)
	}
	data, err := os.ReadFile(wasm)
	if err != nil {
		return err
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if _, err := zw.Write(data); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if old, err := os.ReadFile(out); err == nil && bytes.Equal(old, gz.Bytes()) {
		return nil
	}
	// Written whole, then renamed: a syncloop watching the directory
	// never reads half a module.
	if err := os.WriteFile(out+".tmp", gz.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
