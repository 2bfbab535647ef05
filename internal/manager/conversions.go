package manager

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/syncloop/syncloop/internal/metrics"
	"github.com/syncloop/syncloop/internal/webhook"
	"github.com/syncloop/syncloop/rules"
)

// conversions serve, on every replica, the conversion webhook of the kinds
// the rules in force define in several versions, and keep its
// certificate once a rule needs it: a syncloop whose kinds have one
// version each needs no Secret.
type conversions struct {
	converter *webhook.Converter
	certs     *webhook.Certs // nil: the webhook is not served here
	// clientCAs, when set, are the CAs whose client certificate the
	// webhook requires of its callers.
	clientCAs *webhook.ClientCAs
	once      sync.Once
	// installation is this installation's name: its CRDs are recovered.
	installation string
	// issuer is the cert-manager Certificate (NAMESPACE/NAME) that issues
	// the webhook's certificate; "": syncloop's own.
	issuer string
}

// secretName is the Secret of the webhook's certificate by default.
func secretName(installation string) string {
	if installation == "" {
		return "syncloop-webhook-tls"
	}
	return "syncloop-" + installation + "-webhook-tls"
}

// newConversions builds the converter, and the certificate keeper and
// the client CAs when the webhook is served (serve).
func newConversions(o Options, c *Clients, reg *metrics.Conversions, serve bool) (*conversions, error) {
	cv := &conversions{converter: webhook.NewConverter(), installation: o.Installation, issuer: o.CRDs.CertManager}
	cv.converter.Metrics = reg
	if serve && o.CRDs.ClientCA != "" {
		cas, err := webhook.LoadClientCAs(o.CRDs.ClientCA)
		if err != nil {
			return nil, err
		}
		cv.clientCAs = cas
	}
	if serve {
		cv.certs = webhook.NewCerts(c.Core, o.SyncloopNamespace, cmp.Or(o.CRDs.Secret, secretName(o.Installation)), webhookHosts(o.CRDs.Webhook, o.SyncloopNamespace))
		cv.certs.OnExpiry(reg.CertificateExpires)
		if cv.issuer != "" {
			cv.certs.IssuedBy(cv.issuer)
		}
	}
	return cv, nil
}

// webhookHosts are the names the API server reaches the webhook by: the
// URL's host, or the Service's DNS names.
func webhookHosts(w rules.ConversionWebhook, home string) []string {
	if w.URL != "" {
		u, err := url.Parse(w.URL)
		if err != nil {
			return nil
		}
		return []string{u.Hostname()}
	}
	name, ns := cmp.Or(w.Name, rules.DefaultWebhookService), cmp.Or(w.Namespace, home)
	return []string{name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local", name + "." + ns, name}
}

// use converts set's kinds from now on, and starts keeping the
// certificate the first time a kind converts.
func (cv *conversions) use(ctx context.Context, set *rules.Set) {
	cv.converter.Use(set)
	cv.start(ctx)
}

// start starts keeping the certificate once a kind converts.
func (cv *conversions) start(ctx context.Context) {
	if cv.certs != nil && cv.converter.Kinds() > 0 {
		cv.once.Do(func() { go cv.certs.Run(ctx) })
	}
}

// recover converts the kinds whose CRDs, this installation's, carry
// their conversion (rules.AnnotationConversion) and that no rule of the
// set loaded defines: a rule removed, or broken since before this start,
// whose objects must stay readable. One LIST of syncloop's CRDs, at start.
func (cv *conversions) recover(ctx context.Context, crds dynamic.ResourceInterface) {
	logger := klog.FromContext(ctx)
	list, err := crds.List(ctx, metav1.ListOptions{LabelSelector: rules.LabelManagedBy + "=" + rules.ManagedByValue})
	if err != nil {
		logger.V(1).Info("Cannot list syncloop's CRDs: only the kinds of the rules loaded convert", "err", err)
		return
	}
	for _, crd := range list.Items {
		src, ok := crd.GetAnnotations()[rules.AnnotationConversion]
		if !ok || crd.GetLabels()[rules.LabelInstallation] != cv.installation {
			continue
		}
		a, err := rules.ConversionOf(crd.GetName(), []byte(src))
		if err != nil {
			logger.Error(err, "A CRD's conversion does not compile: its objects convert only once a rule defines the kind", "crd", crd.GetName())
			continue
		}
		if cv.converter.Keep(a) {
			logger.Info("Converting a kind no rule loaded defines, as its CRD keeps it", "crd", crd.GetName(), "rule", crd.GetLabels()[rules.LabelRule])
		}
	}
	cv.start(ctx)
}

// caBundle is what the CRDs that convert must trust; nil when the
// webhook is not served here (its CA bundle is then another's to keep).
func (cv *conversions) caBundle() func() []byte {
	if cv.certs == nil || cv.issuer != "" {
		return nil
	}
	return cv.certs.CABundle
}

// AnnotationInjectCA asks cert-manager's CA injector to keep a CRD's CA
// bundle: the CA of the Certificate it names.
const AnnotationInjectCA = "cert-manager.io/inject-ca-from"

// listen opens the webhook's TLS listener on addr.
func (cv *conversions) listen(addr string) (*server, error) {
	draining := &atomic.Bool{}
	mux := http.NewServeMux()
	mux.Handle(rules.WebhookPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			// HTTP/1.1: the connection ends after this answer; HTTP/2
			// (what the API server speaks): a GOAWAY, after which the
			// client sends again, elsewhere, every request the server
			// had not begun.
			w.Header().Set("Connection", "close")
		}
		cv.converter.ServeHTTP(w, r)
	}))
	srv, err := listen(addr, "conversion webhook", mux, webhookLimits)
	if err != nil {
		return nil, err
	}
	// ServerTLS offers HTTP/2 first: a stop then says which requests were not begun, which
	// the client retries (HTTP/1.1 cannot, and the API server does not
	// retry a conversion call that broke).
	srv.ln = tls.NewListener(srv.ln, webhook.ServerTLS(cv.certs.GetCertificate, cv.clientCAs))
	srv.draining = draining
	return srv, nil
}

// status is the webhook's line of /readyz, and whether it serves: a kind
// that converts needs the serving certificate.
func (cv *conversions) status() (string, bool) {
	if cv == nil {
		return "", true
	}
	n := cv.converter.Kinds()
	switch {
	case n == 0:
		return "", true
	case cv.certs == nil:
		return fmt.Sprintf("conversion webhook: not served here (--webhook-bind-address=0), %d kinds convert elsewhere", n), true
	case !cv.certs.Serving() && cv.issuer != "":
		return fmt.Sprintf("conversion webhook: waiting for cert-manager's Certificate %s to issue its certificate", cv.issuer), false
	case !cv.certs.Serving():
		return "conversion webhook: no serving certificate yet", false
	}
	return fmt.Sprintf("conversion webhook: serving %d kinds", n), true
}
