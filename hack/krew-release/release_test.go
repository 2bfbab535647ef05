package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/syncloop/syncloop/internal/krew"
	"github.com/syncloop/syncloop/internal/testenv"
)

// TestKrewInstall packs this machine's platform as `make krew` does, checks
// the manifest names the archive by its sha256, installs the plugin with
// krew from the manifest and the archive, as `kubectl krew install` would
// after downloading it, runs it through a real kubectl as `kubectl
// syncloop`, and uninstalls it.
func TestKrewInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles syncloop: not a unit test")
	}
	krewBin, err := testenv.Krew()
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := testenv.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	const version = "v0.0.0-krewtest"
	o := options{Version: version, Platforms: []string{runtime.GOOS + "/" + runtime.GOARCH},
		BaseURL: "https://example.com/releases/" + version, Homepage: "https://example.com/syncloop", Dir: "../.."}
	if err := release(o, out); err != nil {
		t.Fatal(err)
	}
	manifestPath := filepath.Join(out, "syncloop.yaml")
	archivePath := filepath.Join(out, krew.ArchiveName(runtime.GOOS, runtime.GOARCH))
	data, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Spec struct {
			Version   string `json:"version"`
			Platforms []struct {
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	archive, err := os.ReadFile(archivePath)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(archive)
	if p := m.Spec.Platforms; m.Spec.Version != version || len(p) != 1 || p[0].SHA256 != hex.EncodeToString(sum[:]) ||
		p[0].URI != o.BaseURL+"/"+krew.ArchiveName(runtime.GOOS, runtime.GOARCH) {
		t.Fatalf("manifest:\n%s\nwant version %s and one platform, the archive's URL and sha256 %x", data, version, sum)
	}

	root := t.TempDir()
	env := append(os.Environ(), "KREW_ROOT="+root, "HOME="+root, "PATH="+filepath.Join(root, "bin")+":"+os.Getenv("PATH"))
	krewRun := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), krewBin, args...)
		cmd.Env = env
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("krew %s: %v\n%s", strings.Join(args, " "), err, got)
		}
		return string(got)
	}
	// The default index, as `kubectl krew update` clones it, carrying the
	// manifest (no network here: the clone is a local git repository).
	index := filepath.Join(root, "index", "default")
	if err := os.MkdirAll(filepath.Join(index, "plugins"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(index, "plugins", krew.PluginName+".yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := exec.Command("git", "init", "-q", index).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, got)
	}
	krewRun("install", "--manifest="+manifestPath, "--archive="+archivePath)
	if got := krewRun("list"); !strings.Contains(got, krew.PluginName) {
		t.Errorf("krew list after install: %q", got)
	}
	// krew reads and validates the manifest from the index.
	if got := krewRun("info", krew.PluginName); !strings.Contains(got, "VERSION: "+version) || !strings.Contains(got, "HOMEPAGE: "+o.Homepage) {
		t.Errorf("krew info: %q", got)
	}
	plugin := exec.CommandContext(t.Context(), kubectl, "syncloop", "version")
	plugin.Env = env
	got, err := plugin.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(got), "syncloop "+version+" ") {
		t.Errorf("kubectl syncloop version: %v, %q; want syncloop %s", err, got, version)
	}
	help := exec.CommandContext(t.Context(), kubectl, "syncloop", "trace", "--help")
	help.Env = env
	if got, err := help.CombinedOutput(); err != nil || !strings.Contains(string(got), "kubectl syncloop trace KIND[.GROUP] NAME") {
		t.Errorf("kubectl syncloop trace --help: %v\n%s", err, got)
	}
	krewRun("uninstall", krew.PluginName)
	if _, err := os.Lstat(filepath.Join(root, "bin", krew.Binary(runtime.GOOS))); !os.IsNotExist(err) {
		t.Errorf("kubectl-syncloop still on PATH after krew uninstall: %v", err)
	}
}
