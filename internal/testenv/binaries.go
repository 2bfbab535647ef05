package testenv

import (
	"fmt"
	"os"
	"path/filepath"
)

// Versions of the control plane and of helm this package expects;
// hack/testenv.sh builds exactly these.
const (
	KubeVersion  = "v1.37.2"
	EtcdVersion  = "v3.6.16"
	HelmVersion  = "v3.22.0"
	Helm4Version = "v4.3.2"
)

// Binary names, as hack/testenv.sh and envtest's asset folders lay them out.
const (
	etcdBinary              = "etcd"
	apiServerBinary         = "kube-apiserver"
	controllerManagerBinary = "kube-controller-manager"
)

// CacheDir is the folder hack/testenv.sh builds the binaries into:
// $SYNCLOOP_TESTENV_DIR when set, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/syncloop/testenv/kube-<v>_etcd-<v>.
func CacheDir() string {
	if d := os.Getenv("SYNCLOOP_TESTENV_DIR"); d != "" {
		return d
	}
	return filepath.Join(defaultCacheRoot(), "kube-"+KubeVersion+"_etcd-"+EtcdVersion)
}

// defaultCacheRoot is ${XDG_CACHE_HOME:-$HOME/.cache}/syncloop/testenv.
func defaultCacheRoot() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "syncloop", "testenv")
}

// Helm returns the path of the helm 3 binary hack/testenv.sh builds:
// $SYNCLOOP_HELM_DIR/helm, else the cache's helm-<version>/helm.
func Helm() (string, error) {
	dir := os.Getenv("SYNCLOOP_HELM_DIR")
	if dir == "" {
		dir = filepath.Join(defaultCacheRoot(), "helm-"+HelmVersion)
	}
	return helmAt(dir)
}

// Helm4 returns the path of the helm 4 binary hack/testenv.sh builds.
func Helm4() (string, error) {
	return helmAt(filepath.Join(defaultCacheRoot(), "helm-"+Helm4Version))
}

func helmAt(dir string) (string, error) {
	p := filepath.Join(dir, "helm")
	if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("helm not found at %s: run hack/testenv.sh (or make test) to build it", p)
	}
	return p, nil
}

// Kubectl returns the path of the kubectl hack/testenv.sh builds.
func Kubectl() (string, error) { return findBinary("kubectl") }

// KrewVersion is the krew hack/testenv.sh builds (pinned in hack/krew).
const KrewVersion = "v0.4.3"

// Krew returns the path of the krew binary hack/testenv.sh builds:
// kubectl's plugin manager, for the test of the plugin's manifest.
func Krew() (string, error) {
	p := filepath.Join(defaultCacheRoot(), "krew-"+KrewVersion, "krew")
	if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("krew not found at %s: run hack/testenv.sh (or make test) to build it", p)
	}
	return p, nil
}

// findBinary returns the path of the named control plane binary: in
// $KUBEBUILDER_ASSETS when it holds it, else in CacheDir.
func findBinary(name string) (string, error) {
	var tried []string
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		tried = append(tried, d)
	}
	tried = append(tried, CacheDir())
	for _, d := range tried {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in %v: run hack/testenv.sh (or make test) to build the local control plane", name, tried)
}
