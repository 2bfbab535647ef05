package krew

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden manifest")

// TestManifest: the manifest of two platforms, as krew's index holds
// them (golden); a version without its v, or a digest that is not one,
// is refused.
func TestManifest(t *testing.T) {
	platforms := []Platform{
		{OS: "linux", Arch: "amd64", URL: "https://example.com/v0.9.0/syncloop-linux-amd64.tar.gz", SHA256: strings.Repeat("a", 64)},
		{OS: "windows", Arch: "amd64", URL: "https://example.com/v0.9.0/syncloop-windows-amd64.tar.gz", SHA256: strings.Repeat("b", 64)},
	}
	got, err := Manifest("v0.9.0", "https://github.com/syncloop/syncloop", platforms)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "syncloop.yaml")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("manifest differs from %s (go test ./internal/krew -update):\n%s", path, got)
	}
	for _, bad := range []struct {
		version string
		sha     string
		want    string
	}{
		{"0.9.0", strings.Repeat("a", 64), "semantic version with its v"},
		{"v0.9", strings.Repeat("a", 64), "semantic version with its v"},
		{"v0.9.0", "ABC", "not 64 lowercase hex digits"},
	} {
		p := []Platform{{OS: "linux", Arch: "amd64", SHA256: bad.sha}}
		if _, err := Manifest(bad.version, "h", p); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Manifest(%q, sha %q): %v, want an error saying %q", bad.version, bad.sha, err, bad.want)
		}
	}
}

// TestWriteArchive: the archive holds the binary, executable, under the
// plugin's name, and is the same bytes every time it is written.
func TestWriteArchive(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "syncloop")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var a, b bytes.Buffer
	sumA, err := WriteArchive(&a, Binary("linux"), bin)
	if err != nil {
		t.Fatal(err)
	}
	sumB, _ := WriteArchive(&b, Binary("linux"), bin)
	if sumA != sumB || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("two archives of one binary differ: %s, %s", sumA, sumB)
	}
	gz, err := gzip.NewReader(&a)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(tr)
	if h.Name != "kubectl-syncloop" || h.Mode != 0o755 || string(data) != "#!/bin/sh\necho hi\n" {
		t.Errorf("entry %s mode %o, %q", h.Name, h.Mode, data)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("a second entry: %v", err)
	}
	if Binary("windows") != "kubectl-syncloop.exe" || ArchiveName("darwin", "arm64") != "syncloop-darwin-arm64.tar.gz" {
		t.Errorf("names: %s, %s", Binary("windows"), ArchiveName("darwin", "arm64"))
	}
}
