package fleet

import (
	"strings"
	"testing"
)

// FuzzKubeconfig: whatever a kubeconfig Secret holds, restConfig never
// panics, and what it takes without trust runs nothing and reads no file:
// no exec or auth-provider plugin, no file, no proxy, TLS verified, an
// https server.
func FuzzKubeconfig(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://10.0.0.1'}}]\nusers: [{name: u, user: {token: t}}]\n"))
	f.Add([]byte("apiVersion: v1\nkind: Config\ncurrent-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://10.0.0.1'}}]\nusers: [{name: u, user: {exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}}]\n"))
	f.Add([]byte(`{"apiVersion":"v1","kind":"Config","current-context":"x","contexts":[{"name":"x","context":{"cluster":"c","user":"u"}}],"clusters":[{"name":"c","cluster":{"server":"http://h","proxy-url":"http://p"}}],"users":[{"name":"u","user":{"tokenFile":"/t"}}]}`))
	f.Fuzz(func(t *testing.T, kubeconfig []byte) {
		cfg, err := restConfig(kubeconfig, Trust{})
		if err != nil {
			if strings.Contains(err.Error(), "\x00") {
				t.Errorf("a refusal holds a NUL: %q", err)
			}
			return
		}
		tls := cfg.TLSClientConfig
		switch {
		case cfg.ExecProvider != nil || cfg.AuthProvider != nil:
			t.Fatal("a plugin was taken")
		case cfg.BearerTokenFile != "" || tls.CAFile != "" || tls.CertFile != "" || tls.KeyFile != "":
			t.Fatal("a file was taken")
		case cfg.Proxy != nil || tls.Insecure:
			t.Fatal("a proxy or insecure TLS was taken")
		case !strings.HasPrefix(cfg.Host, "https://"):
			t.Fatalf("server %q taken", cfg.Host)
		}
	})
}
