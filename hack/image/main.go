// Command image builds syncloop's container image without a Docker engine:
// the static binary, cross-compiled per platform, in one layer with a
// non-root user and CA certificates, written as `docker load`-able archives
// (bin/syncloop-image-<arch>.tar) and, with -push, pushed to a registry as
// a multi-platform index.
//
// It needs no base image (and so no registry to pull one from): the binary
// is static, carries its time zone database (timetzdata) and talks to
// nothing but the API server, so all it needs from an OS is a user, /tmp
// and CA certificates, which this program writes itself — the CA bundle is
// Mozilla's, from golang.org/x/crypto/x509roots/fallback.
//
//	go run ./hack/image -version v0.3.0 -out bin                # make image
//	go run ./hack/image -version v0.3.0 -push ghcr.io/o/syncloop:v0.3.0   # make image-push
package main

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Options say what to build.
type Options struct {
	Version   string   // main.version and the version label
	Revision  string   // the git commit, for the revision label
	Platforms []string // "linux/amd64", …
	Repo      string   // the repository the archives are tagged with
	Dir       string   // the module's root, where ./cmd/syncloop is
}

const (
	binaryPath = "usr/local/bin/syncloop"
	source     = "https://github.com/syncloop/syncloop"
	user       = "65532"
)

func main() {
	var (
		o         Options
		out       string
		push      string
		platforms string
	)
	flag.StringVar(&o.Version, "version", "dev", "version stamped into the binary and the labels")
	flag.StringVar(&o.Revision, "revision", "", "source revision label (default: git rev-parse HEAD)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "platforms to build, comma-separated")
	flag.StringVar(&out, "out", "bin", "directory for the syncloop-image-<arch>.tar archives")
	flag.StringVar(&o.Repo, "repo", "ghcr.io/syncloop/syncloop", "repository the archives are tagged with (:version)")
	flag.StringVar(&push, "push", "", "push a multi-platform image to this reference instead of writing archives")
	flag.StringVar(&o.Dir, "C", ".", "the syncloop module's root directory")
	flag.Parse()
	o.Platforms = strings.Split(platforms, ",")
	if o.Revision == "" {
		if rev, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
			o.Revision = strings.TrimSpace(string(rev))
		}
	}
	if err := run(o, out, push); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(o Options, out, push string) error {
	images := map[string]v1.Image{}
	for _, p := range o.Platforms {
		img, err := Build(o, p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		images[p] = img
	}
	if push != "" {
		ref, err := name.ParseReference(push)
		if err != nil {
			return err
		}
		idx := v1.ImageIndex(empty.Index)
		idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
		for _, p := range o.Platforms {
			plat, _ := v1.ParsePlatform(p)
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: images[p], Descriptor: v1.Descriptor{Platform: plat}})
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return err
		}
		fmt.Println("pushed", ref)
		return nil
	}
	tag, err := name.NewTag(o.Repo + ":" + tagOf(o.Version))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, p := range o.Platforms {
		path := filepath.Join(out, "syncloop-image-"+p[strings.LastIndex(p, "/")+1:]+".tar")
		if err := tarball.WriteToFile(path, tag, images[p]); err != nil {
			return err
		}
		fmt.Println("wrote", path, "("+tag.String()+", "+p+")")
	}
	return nil
}

// tagOf makes a version a valid tag (git describe's "+dirty" is not).
func tagOf(version string) string {
	return strings.NewReplacer("+", "-", "/", "-").Replace(version)
}

// Build compiles syncloop for platform ("linux/arm64") and makes its image.
func Build(o Options, platform string) (v1.Image, error) {
	plat, err := v1.ParsePlatform(platform)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "syncloop-image")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "syncloop")
	// timetzdata: the image has no /usr/share/zoneinfo, and CEL's
	// timestamp functions take time zones.
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "timetzdata", "-ldflags", "-s -w -X main.version="+o.Version, "-o", bin, "./cmd/syncloop")
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+plat.OS, "GOARCH="+plat.Architecture, "GOFLAGS=-buildvcs=false")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build: %w", err)
	}
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layer, err := filesLayer(binary)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()} // reproducible
	cf.Config.User = user + ":" + user
	cf.Config.Entrypoint = []string{"/" + binaryPath}
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/usr/local/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "syncloop",
		"org.opencontainers.image.version":  o.Version,
		"org.opencontainers.image.revision": o.Revision,
		"org.opencontainers.image.source":   source,
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	return mutate.ConfigFile(img, cf)
}

// filesLayer is the image's only layer: the binary, the non-root user and
// the CA certificates, owned by root and fixed in time.
func filesLayer(binary []byte) (v1.Layer, error) {
	var certs bytes.Buffer
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue // distrusted after a date: a PEM bundle cannot say so
		}
		if err := pem.Encode(&certs, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, err
		}
	}
	files := []struct {
		path string
		mode int64
		data []byte
	}{
		{"etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:" + user + ":" + user + ":nonroot:/home/nonroot:/sbin/nologin\n")},
		{"etc/group", 0o644, []byte("root:x:0:\nnonroot:x:" + user + ":\n")},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, certs.Bytes()},
		{binaryPath, 0o755, binary},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	dirs := map[string]bool{}
	for _, f := range files {
		// Parent directories first, once each.
		parts := strings.Split(f.path, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
					return nil, err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.path, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	for _, d := range []tar.Header{
		{Name: "tmp/", Mode: 0o1777},
		{Name: "home/", Mode: 0o755},
		{Name: "home/nonroot/", Mode: 0o700, Uid: 65532, Gid: 65532},
	} {
		d.Typeflag, d.ModTime = tar.TypeDir, epoch
		if err := tw.WriteHeader(&d); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}
