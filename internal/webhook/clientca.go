package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"k8s.io/klog/v2"
)

// ClientCAs are the CAs whose client certificates the webhook requires
// of whoever calls it (run's --webhook-client-ca): the certificates of a
// PEM file, read again when the file changes — a ConfigMap or Secret
// mounted is updated in place — and kept as they were while what the
// file holds does not parse.
type ClientCAs struct {
	path string
	mu   sync.Mutex
	pool *x509.CertPool
	// read is the file as it was last read.
	read os.FileInfo
}

// LoadClientCAs reads the CAs of the PEM file at path: at least one.
func LoadClientCAs(path string) (*ClientCAs, error) {
	c := &ClientCAs{path: path}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the file if it changed since it was last read.
func (c *ClientCAs) reload() error {
	fi, err := os.Stat(c.path)
	if err != nil {
		return fmt.Errorf("the webhook's client CAs: %w", err)
	}
	if c.read != nil && os.SameFile(c.read, fi) && fi.ModTime().Equal(c.read.ModTime()) && fi.Size() == c.read.Size() {
		return nil
	}
	data, err := os.ReadFile(c.path)
	if err != nil {
		return fmt.Errorf("the webhook's client CAs: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return fmt.Errorf("the webhook's client CAs: %s holds no PEM certificate", c.path)
	}
	c.pool, c.read = pool, fi
	return nil
}

// Pool is the CAs as the file holds them now, or as it last held CAs.
func (c *ClientCAs) Pool(ctx context.Context) *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.reload(); err != nil {
		klog.FromContext(ctx).Error(err, "Keeping the webhook's client CAs read before")
	}
	return c.pool
}

// ServerTLS is the webhook's TLS configuration: the certificate
// getCertificate serves, HTTP/2 first; with cas, a client certificate
// signed by one of them — made for client authentication — is required
// before a byte of HTTP is read (tls.RequireAndVerifyClientCert), the
// file of cas read again at each handshake that follows its change.
func ServerTLS(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), cas *ClientCAs) *tls.Config {
	base := &tls.Config{GetCertificate: getCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if cas == nil {
		return base
	}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		if cfg.ClientCAs = cas.Pool(hello.Context()); cfg.ClientCAs == nil {
			return nil, errors.New("no client CA to verify the caller by")
		}
		return cfg, nil
	}
	return base
}
