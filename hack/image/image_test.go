package main

import (
	"archive/tar"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestImage builds the image for this machine's platform as `make image`
// does, reads the archive back as `docker load` would, checks its config
// and files, and runs the binary it holds.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles syncloop: not a unit test")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image runs linux binaries")
	}
	out := t.TempDir()
	platform := "linux/" + runtime.GOARCH
	o := Options{Version: "v0.0.0-imagetest", Revision: "abc123", Platforms: []string{platform}, Repo: "example.com/syncloop", Dir: "../.."}
	if err := run(o, out, ""); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(out, "syncloop-image-"+runtime.GOARCH+".tar")
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil || len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "example.com/syncloop:v0.0.0-imagetest" {
		t.Errorf("archive manifest %+v, %v: want one image tagged example.com/syncloop:v0.0.0-imagetest", manifest, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS+"/"+cf.Architecture != platform || cf.Config.User != "65532:65532" ||
		strings.Join(cf.Config.Entrypoint, " ") != "/usr/local/bin/syncloop" {
		t.Errorf("config: %s/%s, user %q, entrypoint %v", cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint)
	}
	for k, v := range map[string]string{
		"org.opencontainers.image.version":  "v0.0.0-imagetest",
		"org.opencontainers.image.revision": "abc123",
		"org.opencontainers.image.source":   "https://github.com/syncloop/syncloop",
	} {
		if cf.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
		}
	}

	// The files: extract the layers as a runtime would.
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	files := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = h
			if h.Typeflag == tar.TypeReg {
				p := filepath.Join(root, h.Name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				data, _ := io.ReadAll(tr)
				if err := os.WriteFile(p, data, os.FileMode(h.Mode)); err != nil {
					t.Fatal(err)
				}
			}
		}
		rc.Close()
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	certs, _ := os.ReadFile(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt"))
	if !strings.Contains(string(passwd), "nonroot:x:65532:65532:") || strings.Count(string(certs), "BEGIN CERTIFICATE") < 100 {
		t.Errorf("passwd %q, %d CA certificates", passwd, strings.Count(string(certs), "BEGIN CERTIFICATE"))
	}
	if h := files["tmp/"]; h == nil || h.Mode&0o1777 != 0o1777 {
		t.Errorf("no world-writable sticky /tmp: %+v", h)
	}
	// The image has no libc: the binary must need nothing of the kind.
	bin := filepath.Join(root, "usr/local/bin/syncloop")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary has a %v program header: it is not static", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs shared libraries %v", libs)
	}
	f.Close()
	// CEL time zones work without /usr/share/zoneinfo, which the image
	// lacks: the binary carries its own (timetzdata).
	if info, err := exec.Command("go", "version", "-m", bin).CombinedOutput(); err != nil || !strings.Contains(string(info), "-tags=timetzdata") {
		t.Errorf("the binary was not built with timetzdata: %v\n%s", err, info)
	}
	rule := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(rule, []byte(`apiVersion: syncloop.dev/v1alpha1
kind: Rule
metadata: {name: tz}
spec:
  watch: {apiVersion: v1, kind: Namespace}
  resources:
    - id: cm
      template:
        apiVersion: v1
        kind: ConfigMap
        metadata: {name: x, namespace: y}
        data: {hour: "${string(timestamp('2026-01-01T12:00:00Z').getHours('Asia/Tokyo'))}"}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := filepath.Join(t.TempDir(), "o.yaml")
	if err := os.WriteFile(objs, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := exec.Command(bin, "render", "-f", rule, "--objects", objs).CombinedOutput(); err != nil || !strings.Contains(string(got), "hour: \"21\"") {
		t.Errorf("a CEL time zone in the image's binary: %v\n%s", err, got)
	}
	got, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(got), "syncloop v0.0.0-imagetest ") {
		t.Errorf("the image's binary: %q, %v", got, err)
	}
}
