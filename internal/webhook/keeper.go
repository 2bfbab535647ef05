package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Certs keeps the webhook's serving certificate and the CA bundle the
// CRDs trust, in the Secret name of namespace: the first replica to find
// none makes it, any renews it when due (an update conditional on the
// version it read: one replica wins, the others take its material), and
// every replica serves what the Secret holds. The Secret is read from a
// watch of it alone: no request at steady state.
type Certs struct {
	core            kubernetes.Interface
	namespace, name string
	hosts           []string
	now             func() time.Time
	current         atomic.Pointer[keyPair]
	// bundleChanged is called when the CA bundle changes: the CRDs that
	// convert need it. nil: not called.
	bundleChanged func()
	// expires records when the serving certificate expires; nil: not.
	expires func(time.Time)
	store   cache.Store
	wake    chan struct{}
	// issuer, when set, is the cert-manager Certificate (NAMESPACE/NAME)
	// that issues the Secret: it is then only read.
	issuer string
}

// keyPair is what the webhook serves and the CRDs trust.
type keyPair struct {
	cert   *tls.Certificate
	bundle []byte
}

// NewCerts keeps the certificate for hosts (the webhook's DNS names or
// IPs) in Secret namespace/name.
func NewCerts(core kubernetes.Interface, namespace, name string, hosts []string) *Certs {
	return &Certs{core: core, namespace: namespace, name: name, hosts: hosts, now: time.Now, wake: make(chan struct{}, 1)}
}

// IssuedBy makes the keeper only read the Secret, which cert-manager's
// Certificate certificate (NAMESPACE/NAME) issues and renews; its CA
// injector keeps the CA bundle of the CRDs.
func (c *Certs) IssuedBy(certificate string) { c.issuer = certificate }

// OnBundleChange makes f called whenever the CA bundle changes.
func (c *Certs) OnBundleChange(f func()) { c.bundleChanged = f }

// OnExpiry makes f learn when each serving certificate expires.
func (c *Certs) OnExpiry(f func(time.Time)) { c.expires = f }

// GetCertificate serves the current certificate (tls.Config).
func (c *Certs) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if kp := c.current.Load(); kp != nil {
		return kp.cert, nil
	}
	return nil, errors.New("no serving certificate yet")
}

// Serving reports whether it has a certificate to serve.
func (c *Certs) Serving() bool { return c.current.Load() != nil }

// CABundle is the PEM of every CA the CRDs must trust; nil until the
// Secret is read.
func (c *Certs) CABundle() []byte {
	if kp := c.current.Load(); kp != nil {
		return kp.bundle
	}
	return nil
}

// Run keeps the certificate until ctx ends.
func (c *Certs) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("secret", c.namespace+"/"+c.name)
	lw := cache.NewFilteredListWatchFromClient(c.core.CoreV1().RESTClient(), "secrets", c.namespace, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.name).String()
	})
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	c.store = inf.GetStore()
	poke := func(any) {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke})
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	backoff := time.Second
	for {
		next, err := c.safeEnsure(ctx)
		wait := time.Until(next)
		if err != nil {
			logger.Error(err, "Keeping the conversion webhook's certificate")
			wait, backoff = backoff, min(2*backoff, time.Minute)
		} else {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-time.After(wait):
		}
	}
}

// safeEnsure is ensure, a panic contained as its error: a Secret nobody
// expected must not take the process down.
func (c *Certs) safeEnsure(ctx context.Context) (next time.Time, err error) {
	defer func() {
		if p := recover(); p != nil {
			next, err = c.now(), fmt.Errorf("panic keeping the certificate: %v", p)
		}
	}()
	return c.ensure(ctx)
}

// ensure makes or renews the material in the Secret when it is due, serves
// what the Secret holds, and returns when it is next due.
func (c *Certs) ensure(ctx context.Context) (time.Time, error) {
	now := c.now()
	obj, found, err := c.store.GetByKey(c.namespace + "/" + c.name)
	if err != nil {
		return now, err
	}
	var m *material
	secret, _ := obj.(*corev1.Secret)
	if found && secret != nil {
		m = decode(secret.Data)
	} else {
		m = &material{}
	}
	if c.issuer != "" {
		if m.cert == nil {
			return now, fmt.Errorf("no serving certificate in Secret %s/%s yet: cert-manager's Certificate %s issues it", c.namespace, c.name, c.issuer)
		}
		// cert-manager renews it; its watch event brings the new one.
		return now.Add(time.Hour), c.serve(m)
	}
	changed, err := m.renew(now, c.hosts)
	if err != nil {
		return now, err
	}
	if changed {
		if err := c.write(ctx, secret, m); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				return now.Add(time.Second), nil // another replica renewed it: its watch event follows
			}
			return now, err
		}
		klog.FromContext(ctx).Info("Conversion webhook certificate written", "secret", c.namespace+"/"+c.name, "expires", m.cert.NotAfter, "cas", len(m.cas))
	}
	if err := c.serve(m); err != nil {
		return now, err
	}
	return m.next(), nil
}

// write creates the Secret, or updates the version of it read.
func (c *Certs) write(ctx context.Context, old *corev1.Secret, m *material) error {
	secrets := c.core.CoreV1().Secrets(c.namespace)
	if old == nil {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: c.namespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "syncloop", "app.kubernetes.io/component": "conversion-webhook"}},
			Type: corev1.SecretTypeTLS, Data: m.encode()}
		_, err := secrets.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	s := old.DeepCopy()
	s.Data = m.encode()
	_, err := secrets.Update(ctx, s, metav1.UpdateOptions{})
	return err
}

// serve makes m the material served.
func (c *Certs) serve(m *material) error {
	cert, err := tls.X509KeyPair(m.certPEM, m.keyPEM)
	if err != nil {
		return fmt.Errorf("the serving certificate: %w", err)
	}
	bundle := m.bundle()
	old := c.current.Swap(&keyPair{cert: &cert, bundle: bundle})
	if c.expires != nil {
		c.expires(m.cert.NotAfter)
	}
	if (old == nil || !bytes.Equal(old.bundle, bundle)) && c.bundleChanged != nil {
		c.bundleChanged()
	}
	return nil
}
