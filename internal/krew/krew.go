// Package krew packs syncloop as a kubectl plugin for krew, kubectl's
// plugin manager: one archive per platform holding the binary as
// kubectl-syncloop, and the Plugin manifest naming each archive's URL and
// sha256 (krew's v1alpha2 format, as its index holds them). `make krew`
// writes both (hack/krew-release); a user installs with
// `kubectl krew install --manifest=syncloop.yaml`, or from an index that
// carries the manifest.
package krew

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"sigs.k8s.io/yaml"
)

// PluginName is the name kubectl knows the plugin by: kubectl syncloop.
const PluginName = "syncloop"

// Platform is one archive of the plugin.
type Platform struct {
	OS, Arch string
	// URL is where the archive is downloaded from; SHA256 its digest,
	// hex.
	URL, SHA256 string
}

// Binary is the name of the plugin's executable on os.
func Binary(os string) string {
	if os == "windows" {
		return "kubectl-" + PluginName + ".exe"
	}
	return "kubectl-" + PluginName
}

// ArchiveName is the file name of the archive for os/arch.
func ArchiveName(os, arch string) string {
	return fmt.Sprintf("%s-%s-%s.tar.gz", PluginName, os, arch)
}

// fixedTime stamps every archive entry, so that an archive of the same
// binary is the same bytes (and sha256) on every build.
var fixedTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// WriteArchive writes a gzipped tar holding the executable at path
// binaryPath as binary, and returns the archive's sha256.
func WriteArchive(w io.Writer, binary, binaryPath string) (string, error) {
	sum := sha256.New()
	gz := gzip.NewWriter(io.MultiWriter(w, sum))
	gz.ModTime = fixedTime
	tw := tar.NewWriter(gz)
	data, err := os.ReadFile(binaryPath)
	if err != nil {
		return "", err
	}
	if err := tw.WriteHeader(&tar.Header{Name: binary, Mode: 0o755, Size: int64(len(data)), ModTime: fixedTime,
		Typeflag: tar.TypeReg, Uname: "root", Gname: "root", Format: tar.FormatPAX}); err != nil {
		return "", err
	}
	if _, err := tw.Write(data); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(sum.Sum(nil)), nil
}

// Manifest is the plugin's krew manifest at version (semantic, with its
// v: v0.9.0) for platforms.
func Manifest(version, homepage string, platforms []Platform) ([]byte, error) {
	if !semver.MatchString(version) {
		return nil, fmt.Errorf("version %q: krew wants a semantic version with its v, such as v0.9.0", version)
	}
	if len(platforms) == 0 {
		return nil, fmt.Errorf("no platforms")
	}
	var ps []map[string]any
	for _, p := range platforms {
		if !sha.MatchString(p.SHA256) {
			return nil, fmt.Errorf("%s/%s: sha256 %q is not 64 lowercase hex digits", p.OS, p.Arch, p.SHA256)
		}
		files := []map[string]string{{"from": Binary(p.OS), "to": "."}}
		ps = append(ps, map[string]any{
			"selector": map[string]any{"matchLabels": map[string]string{"os": p.OS, "arch": p.Arch}},
			"uri":      p.URL, "sha256": p.SHA256, "bin": Binary(p.OS), "files": files,
		})
	}
	return yaml.Marshal(map[string]any{
		"apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
		"kind":       "Plugin",
		"metadata":   map[string]any{"name": PluginName},
		"spec": map[string]any{
			"version":          version,
			"homepage":         homepage,
			"shortDescription": "Trace what syncloop made of an object, and why it waits",
			"description":      description,
			"platforms":        ps,
		},
	})
}

const description = `syncloop is a Kubernetes controller whose behaviour is written as YAML
rules. This plugin is the syncloop command line as kubectl syncloop:

  kubectl syncloop trace app web -n shop   # the rules, resources and
                                           # children of one trigger, and why
                                           # it is not ready
  kubectl syncloop rollout status          # the rules' revisions and rollouts
  kubectl syncloop plan -f rules/          # what syncloop would change now
  kubectl syncloop graph -f rules/         # a rule's graph, as Mermaid or dot

trace, rollout status and plan read the cluster of kubectl's context; none
needs syncloop running.
`

var (
	semver = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
	sha    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)
