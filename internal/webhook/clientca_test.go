package webhook

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// caFor is a CA and its key, PEM-encoded for a client CA file.
type caFor struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) caFor {
	t.Helper()
	ca, key, err := newCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return caFor{ca, key}
}

func (c caFor) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
}

// issue is a certificate for usage signed by c, as a TLS client presents
// it.
func (c caFor) issue(t *testing.T, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, sn, err := newKey()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestServerTLSClientCA: with client CAs, the webhook serves only a
// caller whose client certificate one of them signed for client
// authentication — none, another CA's, or a serving certificate of the
// right CA is refused in the handshake — and a change of the CA file
// takes effect at the next handshake, a file that no longer parses
// leaving the CAs as they were. Without, any caller is served.
func TestServerTLSClientCA(t *testing.T) {
	serving := &material{}
	if _, err := serving.renew(time.Now(), []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(serving.certPEM, serving.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(serving.cas[0])
	trusted, other := newTestCA(t), newTestCA(t)
	file := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(file, trusted.pem(), 0o600); err != nil {
		t.Fatal(err)
	}
	cas, err := LoadClientCAs(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadClientCAs(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a client CA file that is not there was loaded")
	}

	c := NewConverter()
	c.Use(versionsSet(t))
	serve := func(cas *ClientCAs) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			_ = srv.Serve(tls.NewListener(ln, ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &pair, nil }, cas)))
		}()
		t.Cleanup(func() { srv.Close() })
		return "https://" + ln.Addr().String() + "/convert"
	}
	call := func(url string, certs ...tls.Certificate) error {
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}, ForceAttemptHTTP2: true}}
		defer client.CloseIdleConnections()
		resp, err := client.Post(url, "application/json", bytes.NewReader(reviewBody("example.syncloop.dev/v1", alphaApp)))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("served, but answered %d", resp.StatusCode)
		}
		return nil
	}

	url := serve(cas)
	for name, certs := range map[string][]tls.Certificate{
		"no certificate": nil,
		"another CA's":   {other.issue(t, x509.ExtKeyUsageClientAuth)},
		"the CA's, made for serving, not as a client": {trusted.issue(t, x509.ExtKeyUsageServerAuth)},
	} {
		if err := call(url, certs...); err == nil {
			t.Errorf("%s: served", name)
		}
	}
	if err := call(url, trusted.issue(t, x509.ExtKeyUsageClientAuth)); err != nil {
		t.Errorf("a client certificate of the CA: %v", err)
	}

	// The file changes to the other CA: the next handshake trusts it alone.
	if err := os.WriteFile(file, append(other.pem(), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := call(url, other.issue(t, x509.ExtKeyUsageClientAuth)); err != nil {
		t.Errorf("after the file changed, the new CA's client: %v", err)
	}
	if err := call(url, trusted.issue(t, x509.ExtKeyUsageClientAuth)); err == nil {
		t.Error("after the file changed, the old CA's client was served")
	}
	// A file that no longer parses: the CAs stay as they were.
	if err := os.WriteFile(file, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := call(url, other.issue(t, x509.ExtKeyUsageClientAuth)); err != nil {
		t.Errorf("after the file broke, the CA read before: %v", err)
	}

	if err := call(serve(nil)); err != nil {
		t.Errorf("without client CAs, a caller without a certificate: %v", err)
	}
}
