package fleet

import (
	"fmt"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/syncloop/syncloop/internal/printable"
)

// A kubeconfig from a Secret is data, never code or a path. Whoever may
// write a Secret in the clusters namespace writes it, and syncloop reads
// it with its own process, files and ServiceAccount token: an exec
// plugin would run a program of the writer's choosing as syncloop, a
// tokenFile of /var/run/secrets/…/token would send syncloop's own token
// to a server of the writer's choosing. So only what the kubeconfig
// holds inline is taken: the server, its CA data and TLS server name,
// a token, client certificate and key data, basic-auth credentials and
// impersonation. Everything else — a field syncloop does not know
// included — refuses the Secret, unless the operator trusts the
// inventory's writers with it (Trust), as Flux's controllers do with
// --insecure-kubeconfig-exec and --insecure-kubeconfig-tls.

// Trust is what a kubeconfig from a Secret may do beyond inline
// credentials. Each is an operator's opt-in, off by default.
type Trust struct {
	// Exec (--insecure-kubeconfig-exec) allows exec and auth-provider
	// plugins and file references (tokenFile, client-certificate,
	// client-key, certificate-authority): the writer of a Secret may run
	// a program as syncloop and read syncloop's files.
	Exec bool
	// TLS (--insecure-kubeconfig-tls) allows insecure-skip-tls-verify and
	// a server that is not https: syncloop's requests, credentials
	// included, may be read and answered by anyone on the way.
	TLS bool
	// Proxy (--insecure-kubeconfig-proxy) allows proxy-url: every request
	// to the cluster, credentials included, goes through a server of the
	// writer's choosing.
	Proxy bool
}

// Flags that allow what Trust allows, named in refusals.
const (
	FlagExec  = "--insecure-kubeconfig-exec"
	FlagTLS   = "--insecure-kubeconfig-tls"
	FlagProxy = "--insecure-kubeconfig-proxy"
)

// MaxKubeconfig bounds the kubeconfig read from a Secret: a kubeconfig
// of inline certificates is a few KiB; a Secret may hold 1 MiB.
const MaxKubeconfig = 256 << 10

// allowed is what the fields of a kubeconfig's cluster and user may hold:
// for each field (by its kubeconfig name) the flag that allows it, ""
// for always. A field not listed is refused whatever the flags: a field
// a later client-go adds is refused until it is known here.
var allowed = map[string]string{
	// clusters[].cluster
	"server": "", "tls-server-name": "", "certificate-authority-data": "", "disable-compression": "",
	"insecure-skip-tls-verify": FlagTLS, "proxy-url": FlagProxy, "certificate-authority": FlagExec,
	// users[].user
	"client-certificate-data": "", "client-key-data": "", "token": "", "username": "", "password": "",
	"act-as": "", "act-as-uid": "", "act-as-groups": "", "act-as-user-extra": "",
	"exec": FlagExec, "auth-provider": FlagExec, "tokenFile": FlagExec, "client-certificate": FlagExec, "client-key": FlagExec,
	// never read from the data (LocationOfOrigin), or read by no one
	"-": "", "extensions": "",
}

// why says what a field a flag allows does, for a refusal.
var why = map[string]string{
	FlagExec:  "a kubeconfig from a Secret may not run a program or read a file of syncloop's",
	FlagTLS:   "a kubeconfig from a Secret may not turn off the server's TLS verification",
	FlagProxy: "a kubeconfig from a Secret may not send syncloop's requests through a proxy",
}

// trusts reports whether t allows what flag allows.
func (t Trust) trusts(flag string) bool {
	switch flag {
	case "":
		return true
	case FlagExec:
		return t.Exec
	case FlagTLS:
		return t.TLS
	case FlagProxy:
		return t.Proxy
	}
	return false
}

// yamlLine finds where a YAML error is, without what is there.
var yamlLine = regexp.MustCompile(`line \d+`)

// restConfig makes the client configuration of a kubeconfig's current
// context, if trust allows all it holds (checkKubeconfig). Its errors
// say where and what is wrong, never what the kubeconfig holds: a YAML
// error is reduced to its line.
func restConfig(kubeconfig []byte, trust Trust) (*rest.Config, error) {
	if len(kubeconfig) > MaxKubeconfig {
		return nil, fmt.Errorf("key %q holds %d bytes, more than a kubeconfig of inline credentials needs (%d)", KubeconfigKey, len(kubeconfig), MaxKubeconfig)
	}
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil {
		where := yamlLine.FindString(err.Error())
		if where == "" {
			where = "somewhere"
		}
		return nil, fmt.Errorf("key %q is not a kubeconfig: it does not parse (%s)", KubeconfigKey, where)
	}
	if err := checkKubeconfig(raw, trust); err != nil {
		return nil, fmt.Errorf("the kubeconfig in key %q is refused: %w", KubeconfigKey, err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig in key %q makes no client: %s", KubeconfigKey, redact(err.Error(), kubeconfig))
	}
	if err := checkConfig(cfg, trust); err != nil { // what checkKubeconfig let through, as client-go reads it
		return nil, fmt.Errorf("the kubeconfig in key %q is refused: %w", KubeconfigKey, err)
	}
	return cfg, nil
}

// checkKubeconfig refuses a kubeconfig whose current context's cluster
// or user holds anything trust does not allow. Only the current context
// is checked: it is the only one a client is made of. Its errors name
// kubeconfig fields, never a name or value the kubeconfig holds.
func checkKubeconfig(raw *clientcmdapi.Config, trust Trust) error {
	ctx, ok := raw.Contexts[raw.CurrentContext]
	switch {
	case raw.CurrentContext == "":
		return fmt.Errorf("it names no current-context")
	case !ok:
		return fmt.Errorf("its current-context is not among its contexts")
	}
	cluster, ok := raw.Clusters[ctx.Cluster]
	if !ok {
		return fmt.Errorf("the current context's cluster is not among its clusters")
	}
	if err := checkFields("the current context's cluster", cluster, trust); err != nil {
		return err
	}
	if err := checkServer(cluster.Server, trust); err != nil {
		return fmt.Errorf("the current context's cluster: server: %w", err)
	}
	if ctx.AuthInfo == "" {
		return nil // anonymous
	}
	user, ok := raw.AuthInfos[ctx.AuthInfo]
	if !ok {
		return fmt.Errorf("the current context's user is not among its users")
	}
	return checkFields("the current context's user", user, trust)
}

// checkFields refuses the fields of v (a *clientcmdapi.Cluster or
// *AuthInfo) that hold a value trust does not allow, each named by its
// kubeconfig name after path.
func checkFields(path string, v any, trust Trust) error {
	rv := reflect.ValueOf(v).Elem()
	var refused []string
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		if rv.Field(i).IsZero() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		flag, known := allowed[name]
		switch {
		case !known:
			refused = append(refused, fmt.Sprintf("%s: %s: a field syncloop does not read from a Secret", path, name))
		case !trust.trusts(flag):
			refused = append(refused, fmt.Sprintf("%s: %s: %s (%s allows it)", path, name, why[flag], flag))
		}
	}
	if len(refused) > 0 {
		slices.Sort(refused)
		return fmt.Errorf("%s", strings.Join(refused, "; "))
	}
	return nil
}

// checkServer refuses a server that is not an https URL with a host,
// unless trust allows plain http.
func checkServer(server string, trust Trust) error {
	u, err := url.Parse(server)
	switch {
	case server == "":
		return fmt.Errorf("empty: a client would go to a default server")
	case err != nil || u.Host == "":
		return fmt.Errorf("not a URL with a host")
	case u.User != nil:
		return fmt.Errorf("a URL with credentials in it: put them in the user")
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && trust.TLS:
		return nil
	case u.Scheme == "http":
		return fmt.Errorf("plain http: %s (%s allows it)", why[FlagTLS], FlagTLS)
	}
	return fmt.Errorf("scheme %q: https only", u.Scheme)
}

// checkConfig refuses a client configuration that would run a program,
// read a file or go around TLS or through a proxy where trust does not
// allow it: what a kubeconfig became, checked again as client-go made it.
func checkConfig(cfg *rest.Config, trust Trust) error {
	tls := cfg.TLSClientConfig
	switch {
	case !trust.Exec && (cfg.ExecProvider != nil || cfg.AuthProvider != nil):
		return fmt.Errorf("it runs an authentication plugin: %s (%s allows it)", why[FlagExec], FlagExec)
	case !trust.Exec && (cfg.BearerTokenFile != "" || tls.CAFile != "" || tls.CertFile != "" || tls.KeyFile != ""):
		return fmt.Errorf("it reads a file: %s (%s allows it)", why[FlagExec], FlagExec)
	case !trust.TLS && tls.Insecure:
		return fmt.Errorf("it skips TLS verification: %s (%s allows it)", why[FlagTLS], FlagTLS)
	case !trust.Proxy && cfg.Proxy != nil:
		return fmt.Errorf("it goes through a proxy: %s (%s allows it)", why[FlagProxy], FlagProxy)
	}
	return nil
}

// redact blanks out of msg anything of at least 8 characters that the
// kubeconfig holds as a value — a token, a password, a key — and escapes
// the rest.
func redact(msg string, kubeconfig []byte) string {
	for _, f := range strings.FieldsFunc(string(kubeconfig), func(r rune) bool { return r == ' ' || r == '\n' || r == '"' || r == '\'' || r == ':' }) {
		if len(f) >= 8 && strings.Contains(msg, f) {
			msg = strings.ReplaceAll(msg, f, "[redacted]")
		}
	}
	// client-go quotes names as they are: what reaches the log, Events
	// and /readyz is escaped.
	return printable.Text(msg)
}
