// Command krew-release packs syncloop as a kubectl plugin for krew: it
// cross-compiles the binary per platform (static, as the image's), writes
// each as kubectl-syncloop in a reproducible archive, and the krew
// manifest that names each archive's download URL and sha256.
//
//	go run ./hack/krew-release -version v0.9.0 -out bin/krew   # make krew VERSION=v0.9.0
//
// The archives go to the release at -base-url (by default the GitHub
// release of the version); the manifest, bin/krew/syncloop.yaml, installs
// from there (kubectl krew install --manifest=bin/krew/syncloop.yaml) or
// goes into a krew index.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/syncloop/syncloop/internal/krew"
)

func main() {
	version := flag.String("version", "", "the release's version, semantic with its v: v0.9.0")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64,windows/amd64", "os/arch pairs to pack, comma-separated")
	out := flag.String("out", "bin/krew", "directory for the archives and syncloop.yaml")
	baseURL := flag.String("base-url", "https://github.com/syncloop/syncloop/releases/download/VERSION", "where the archives are downloaded from (VERSION: -version)")
	homepage := flag.String("homepage", "https://github.com/syncloop/syncloop", "the plugin's homepage")
	flag.Parse()
	o := options{Version: *version, Platforms: strings.Split(*platforms, ","), BaseURL: strings.ReplaceAll(*baseURL, "VERSION", *version), Homepage: *homepage, Dir: "."}
	if err := release(o, *out); err != nil {
		fmt.Fprintln(os.Stderr, "krew-release:", err)
		os.Exit(1)
	}
}

// options are what a release packs.
type options struct {
	Version   string
	Platforms []string // os/arch
	BaseURL   string   // the archives' download URLs, without their names
	Homepage  string
	Dir       string // the module's root, where ./cmd/syncloop is
}

// release builds and packs o's platforms into out, and writes the
// manifest there.
func release(o options, out string) error {
	version := o.Version
	if _, err := krew.Manifest(version, o.Homepage, []krew.Platform{{OS: "linux", Arch: "amd64", SHA256: strings.Repeat("0", 64)}}); err != nil {
		return err // a bad version, before minutes of compiling
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	build, err := os.MkdirTemp("", "krew-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(build)
	var packed []krew.Platform
	for _, p := range o.Platforms {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok {
			return fmt.Errorf("platform %q: want os/arch", p)
		}
		bin := filepath.Join(build, goos+"-"+goarch, krew.Binary(goos))
		cmd := exec.Command("go", "build", "-trimpath", "-tags", "timetzdata", "-ldflags", "-s -w -X main.version="+version, "-o", bin, "./cmd/syncloop")
		cmd.Stdout, cmd.Stderr, cmd.Dir = os.Stderr, os.Stderr, o.Dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building for %s/%s: %w", goos, goarch, err)
		}
		name := krew.ArchiveName(goos, goarch)
		f, err := os.Create(filepath.Join(out, name))
		if err != nil {
			return err
		}
		sum, err := krew.WriteArchive(f, krew.Binary(goos), bin)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		packed = append(packed, krew.Platform{OS: goos, Arch: goarch, URL: o.BaseURL + "/" + name, SHA256: sum})
		fmt.Fprintf(os.Stderr, "%s  %s\n", sum, filepath.Join(out, name))
	}
	manifest, err := krew.Manifest(version, o.Homepage, packed)
	if err != nil {
		return err
	}
	path := filepath.Join(out, krew.PluginName+".yaml")
	if err := os.WriteFile(path, manifest, 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	return nil
}
