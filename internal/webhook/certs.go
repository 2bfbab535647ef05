package webhook

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// Lifetimes of what syncloop signs, and when it renews them: a CA or a
// certificate is renewed once less than a third of its life is left.
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	CertLifetime = 365 * 24 * time.Hour
	// caOverlap is how long a new CA is trusted (in the CA bundle of
	// every CRD) before the serving certificate is signed by it: the
	// CRDs take the new bundle meanwhile.
	caOverlap = time.Hour
)

// Keys of the Secret that holds the material.
const (
	keyCABundle = "ca.crt" // every CA the CRDs trust, newest first
	keyCAKey    = "ca.key" // the newest CA's key
	keyCert     = "tls.crt"
	keyKey      = "tls.key"
)

// material is what the Secret holds, decoded.
type material struct {
	cas             []*x509.Certificate // newest first
	caKey           *ecdsa.PrivateKey   // the newest CA's
	cert            *x509.Certificate
	certPEM, keyPEM []byte
}

// decode reads the Secret's data; what does not decode is left nil, and
// renew makes it anew.
func decode(data map[string][]byte) *material {
	m := &material{certPEM: data[keyCert], keyPEM: data[keyKey]}
	for rest := data[keyCABundle]; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			m.cas = append(m.cas, c)
		}
	}
	if b, _ := pem.Decode(data[keyCAKey]); b != nil {
		m.caKey, _ = x509.ParseECPrivateKey(b.Bytes)
	}
	if b, _ := pem.Decode(m.certPEM); b != nil {
		m.cert, _ = x509.ParseCertificate(b.Bytes)
	}
	if len(m.cas) > 0 && m.caKey != nil && !m.caKey.PublicKey.Equal(m.cas[0].PublicKey) {
		m.caKey = nil
	}
	if _, err := tls.X509KeyPair(m.certPEM, m.keyPEM); err != nil {
		m.cert = nil
	}
	return m
}

// encode is m as the Secret's data.
func (m *material) encode() map[string][]byte {
	data := map[string][]byte{keyCABundle: m.bundle(), keyCert: m.certPEM, keyKey: m.keyPEM}
	if m.caKey != nil {
		keyDER, _ := x509.MarshalECPrivateKey(m.caKey)
		data[keyCAKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	}
	return data
}

// bundle is the PEM of every CA m holds, newest first.
func (m *material) bundle() []byte {
	var b bytes.Buffer
	for _, c := range m.cas {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// due reports whether c should be renewed at now: less than a third of
// its life left.
func due(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore)
	return now.After(c.NotAfter.Add(-life / 3))
}

// renew makes what m lacks or what is due at now, for hosts, and reports
// whether it changed anything (the Secret is then written). A CA that is
// due gets a successor, trusted beside it at once; the serving
// certificate moves to the successor caOverlap later, once every CRD
// trusts it. Expired CAs leave the bundle.
func (m *material) renew(now time.Time, hosts []string) (bool, error) {
	changed := false
	m.cas = slices.DeleteFunc(m.cas, func(c *x509.Certificate) bool { return now.After(c.NotAfter) })
	if len(m.cas) == 0 || m.caKey == nil || due(m.cas[0], now) {
		ca, key, err := newCA(now)
		if err != nil {
			return false, err
		}
		fresh := len(m.cas) == 0 || m.caKey == nil
		if fresh {
			m.cas = nil
		}
		m.cas, m.caKey, changed = append([]*x509.Certificate{ca}, m.cas...), key, true
		if fresh {
			m.cert = nil // nothing trusts the one there
		}
	}
	newest := m.cas[0]
	signedByOld := m.cert != nil && m.cert.CheckSignatureFrom(newest) != nil
	switch {
	case m.cert == nil, due(m.cert, now), !covers(m.cert, hosts),
		signedByOld && now.Sub(newest.NotBefore) >= caOverlap,
		signedByOld && !slices.ContainsFunc(m.cas, func(ca *x509.Certificate) bool { return m.cert.CheckSignatureFrom(ca) == nil }):
		certPEM, keyPEM, err := newCert(now, newest, m.caKey, hosts)
		if err != nil {
			return false, err
		}
		m.certPEM, m.keyPEM = certPEM, keyPEM
		m.cert, _ = x509.ParseCertificate(mustPEM(certPEM))
		changed = true
	}
	return changed, nil
}

// next is when m is next due for a change.
func (m *material) next() time.Time {
	at := func(c *x509.Certificate) time.Time { return c.NotAfter.Add(-c.NotAfter.Sub(c.NotBefore) / 3) }
	t := at(m.cert)
	for i, ca := range m.cas {
		if i == 0 {
			t = minTime(t, at(ca))
			if m.cert.CheckSignatureFrom(ca) != nil {
				t = minTime(t, ca.NotBefore.Add(caOverlap))
			}
		}
		t = minTime(t, ca.NotAfter)
	}
	return t
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func mustPEM(data []byte) []byte {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil
	}
	return b.Bytes
}

// covers reports whether c is valid for every host.
func covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// newKey is a new key and a serial number for the certificate of it.
func newKey() (*ecdsa.PrivateKey, *big.Int, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return key, sn, err
}

// newCA makes a self-signed CA valid from now (a minute back, for clocks
// a little behind).
func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, sn, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: fmt.Sprintf("syncloop-webhook-ca@%d", now.Unix())},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(CALifetime),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

// newCert makes a serving certificate for hosts signed by ca.
func newCert(now time.Time, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("no host to make a certificate for")
	}
	key, sn, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn, Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Minute), NotAfter: minTime(now.Add(CertLifetime), ca.NotAfter),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
