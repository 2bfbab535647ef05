package fleet

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// kubeconfigOf is a kubeconfig of one context whose cluster and user are
// cluster and user, as YAML.
func kubeconfigOf(t *testing.T, cluster *clientcmdapi.Cluster, user *clientcmdapi.AuthInfo) []byte {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = cluster
	kc.AuthInfos["u"] = user
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	out, err := clientcmd.Write(*kc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKubeconfigRefused: a kubeconfig from a Secret may hold inline
// credentials only. Every field that runs a program, reads a file, skips
// TLS or goes through a proxy is refused, naming the field and the flag
// that allows it, and is taken once the flag trusts it; a field syncloop
// does not know is refused whatever the flags.
func TestKubeconfigRefused(t *testing.T) {
	const server = "https://10.0.0.1:6443"
	inline := &clientcmdapi.AuthInfo{Token: "t0ken-inline"}
	exec := &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh", Args: []string{"-c", "id"}, InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
	all := Trust{Exec: true, TLS: true, Proxy: true}
	file := filepath.Join(t.TempDir(), "a-file") // one of syncloop's: its ServiceAccount token, its CA
	if err := os.WriteFile(file, []byte("syncloops-own"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		cluster *clientcmdapi.Cluster
		user    *clientcmdapi.AuthInfo
		field   string // in the refusal
		trust   Trust  // what takes it; zero: nothing does
	}{
		{"exec", &clientcmdapi.Cluster{Server: server}, &clientcmdapi.AuthInfo{Exec: exec}, "exec", Trust{Exec: true}},
		{"exec beside a token", &clientcmdapi.Cluster{Server: server}, &clientcmdapi.AuthInfo{Token: "t", Exec: exec}, "exec", Trust{Exec: true}},
		{"auth-provider", &clientcmdapi.Cluster{Server: server}, &clientcmdapi.AuthInfo{AuthProvider: &clientcmdapi.AuthProviderConfig{Name: "oidc", Config: map[string]string{"idp-issuer-url": "https://x"}}}, "auth-provider", Trust{Exec: true}},
		{"tokenFile", &clientcmdapi.Cluster{Server: server}, &clientcmdapi.AuthInfo{TokenFile: file}, "tokenFile", Trust{Exec: true}},
		{"client-certificate", &clientcmdapi.Cluster{Server: server}, &clientcmdapi.AuthInfo{ClientCertificate: file, ClientKeyData: []byte("k")}, "client-certificate", Trust{Exec: true}},
		{"client-key", &clientcmdapi.Cluster{Server: server}, &clientcmdapi.AuthInfo{ClientCertificateData: []byte("c"), ClientKey: file}, "client-key", Trust{Exec: true}},
		{"certificate-authority", &clientcmdapi.Cluster{Server: server, CertificateAuthority: file}, inline, "certificate-authority", Trust{Exec: true}},
		{"proxy-url", &clientcmdapi.Cluster{Server: server, ProxyURL: "http://evil.example:3128"}, inline, "proxy-url", Trust{Proxy: true}},
		{"insecure-skip-tls-verify", &clientcmdapi.Cluster{Server: server, InsecureSkipTLSVerify: true}, inline, "insecure-skip-tls-verify", Trust{TLS: true}},
		{"plain http", &clientcmdapi.Cluster{Server: "http://10.0.0.1:8080"}, inline, "plain http", Trust{TLS: true}},
		{"no server", &clientcmdapi.Cluster{}, inline, "server: empty", Trust{}},
		{"another scheme", &clientcmdapi.Cluster{Server: "unix:///var/run/docker.sock"}, inline, "server: not a URL with a host", Trust{}},
		{"credentials in the URL", &clientcmdapi.Cluster{Server: "https://u:p@10.0.0.1"}, inline, "credentials in it", Trust{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := kubeconfigOf(t, tc.cluster, tc.user)
			_, err := restConfig(kc, Trust{})
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("restConfig = %v, want a refusal naming %q", err, tc.field)
			}
			if (tc.trust != Trust{}) {
				flag := map[Trust]string{{Exec: true}: FlagExec, {TLS: true}: FlagTLS, {Proxy: true}: FlagProxy}[tc.trust]
				if !strings.Contains(err.Error(), flag+" allows it") {
					t.Errorf("refusal %q does not name %s", err, flag)
				}
				if _, err := restConfig(kc, tc.trust); err != nil {
					t.Errorf("with %s: %v, want it taken", flag, err)
				}
				return
			}
			if _, err := restConfig(kc, all); err == nil {
				t.Error("taken with every flag, want it refused whatever the flags")
			}
		})
	}
	for name, kc := range map[string]string{
		"no current-context":  "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: " + server + "}}]\n",
		"a missing context":   "apiVersion: v1\nkind: Config\ncurrent-context: s3cr3t-name\n",
		"a missing cluster":   "apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: {cluster: s3cr3t-name}}]\n",
		"a missing user":      "apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: {cluster: c, user: s3cr3t-name}}]\nclusters: [{name: c, cluster: {server: " + server + "}}]\n",
		"over the size bound": "apiVersion: v1\nkind: Config\n#" + strings.Repeat("x", MaxKubeconfig),
	} {
		if _, err := restConfig([]byte(kc), all); err == nil || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: %v, want a refusal that names nothing the kubeconfig holds", name, err)
		}
	}
	if cfg, err := restConfig(kubeconfigOf(t, &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: []byte("ca"), TLSServerName: "api"},
		&clientcmdapi.AuthInfo{Token: "t0ken", Impersonate: "someone"}), Trust{}); err != nil || cfg.BearerToken != "t0ken" || cfg.Host != server {
		t.Errorf("inline credentials: %v, %v; want them taken", cfg, err)
	}
}

// TestKubeconfigExecNeverRuns: the attack itself. A kubeconfig whose
// user runs /bin/sh makes no client, so the command never runs; one whose
// tokenFile is syncloop's ServiceAccount token makes no client, so a
// server of the writer's choosing never sees the token. With
// --insecure-kubeconfig-exec both happen: the test can tell.
func TestKubeconfigExecNeverRuns(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("syncloops-own-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "no", http.StatusForbidden)
	}))
	defer srv.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cluster := &clientcmdapi.Cluster{Server: srv.URL, CertificateAuthorityData: caPEM}
	shell := kubeconfigOf(t, cluster, &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1",
		Command: "/bin/sh", Args: []string{"-c", "touch " + marker + "; echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"x\"}}'"},
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode}})
	stolen := kubeconfigOf(t, cluster, &clientcmdapi.AuthInfo{TokenFile: tokenFile})

	ask := func(kc []byte, trust Trust) error {
		cfg, err := restConfig(kc, trust)
		if err != nil {
			return err
		}
		d, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return err
		}
		_, err = d.ServerVersion()
		return err
	}
	for _, kc := range [][]byte{shell, stolen} {
		if err := ask(kc, Trust{}); err == nil || !strings.Contains(err.Error(), FlagExec) {
			t.Errorf("by default: %v, want a refusal naming %s", err, FlagExec)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the kubeconfig's command ran")
	}
	mu.Lock()
	if len(seen) != 0 {
		t.Fatalf("the writer's server was asked %d times, with %q", len(seen), seen)
	}
	mu.Unlock()

	// Trusted, both go through: what the default refuses is what the
	// attack needs.
	_ = ask(shell, Trust{Exec: true})
	_ = ask(stolen, Trust{Exec: true})
	if _, err := os.Stat(marker); err != nil {
		t.Error("trusted, the command did not run: the test shows nothing")
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(strings.Join(seen, " "), "Bearer syncloops-own-token") {
		t.Errorf("trusted, the server saw %q: the test shows nothing", seen)
	}
}

// TestRefusalEscaped: client-go's refusal of a kubeconfig quotes the
// user's name as it is; what syncloop logs, emits and shows of it has no
// raw control character and stays on one line.
func TestRefusalEscaped(t *testing.T) {
	kubeconfig := "apiVersion: v1\nkind: Config\n" +
		"clusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n" +
		"users: [{name: \"u \\e]0;x\\a \\e[2J\\nFAKE: ok\", user: {token: t0, username: a, password: b}}]\n" +
		"contexts: [{name: x, context: {cluster: c, user: \"u \\e]0;x\\a \\e[2J\\nFAKE: ok\"}}]\ncurrent-context: x\n"
	_, err := restConfig([]byte(kubeconfig), Trust{})
	if err == nil {
		t.Fatal("a user with a token and a password made a client")
	}
	if msg := err.Error(); strings.ContainsAny(msg, "\x1b\x07\n") {
		t.Errorf("the refusal holds raw control characters: %q", msg)
	}
}
