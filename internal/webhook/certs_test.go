package webhook

import (
	"testing"
	"time"
)

// TestRenew: what the Secret lacks is made, nothing is renewed before it
// is due, a due certificate is renewed by the same CA, and a due CA gets
// a successor trusted at once but signing only caOverlap later; expired
// CAs leave the bundle.
func TestRenew(t *testing.T) {
	hosts := []string{"syncloop-webhook.syncloop.svc", "127.0.0.1"}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &material{}
	if changed, err := m.renew(now, hosts); err != nil || !changed {
		t.Fatalf("first renew: changed %v, %v", changed, err)
	}
	if len(m.cas) != 1 || m.cert.CheckSignatureFrom(m.cas[0]) != nil || !covers(m.cert, hosts) {
		t.Fatal("a fresh Secret: want one CA and a certificate it signed for the hosts")
	}
	// What the Secret holds decodes to the same.
	m = decode(m.encode())
	if changed, _ := m.renew(now.Add(time.Hour), hosts); changed {
		t.Error("renewed what was not due")
	}
	ca, cert := m.cas[0], m.cert
	if next := m.next(); !next.Equal(cert.NotAfter.Add(-cert.NotAfter.Sub(cert.NotBefore) / 3)) {
		t.Errorf("next due %v, want a third of the certificate's life before it expires", next)
	}

	// A host added: a new certificate at once.
	if changed, _ := m.renew(now.Add(2*time.Hour), append(hosts, "other.example")); !changed || m.cert.Equal(cert) || m.cas[0] != ca {
		t.Error("a new host: want a new certificate from the same CA")
	}
	// The certificate due: renewed by the same CA.
	cert = m.cert
	at := cert.NotAfter.Add(-CertLifetime / 4)
	if changed, _ := m.renew(at, hosts); !changed || m.cert.Equal(cert) || m.cert.CheckSignatureFrom(ca) != nil {
		t.Error("a due certificate: want a new one signed by the same CA")
	}

	// The CA due: a successor in the bundle first, the certificate still
	// the old CA's; caOverlap later, the successor's.
	at = ca.NotAfter.Add(-CALifetime / 4)
	cert = m.cert
	m.cert.NotAfter = at.Add(CertLifetime) // not due itself
	m.cert.NotBefore = at
	if changed, _ := m.renew(at, hosts); !changed || len(m.cas) != 2 || m.cas[1] != ca || m.cert != cert {
		t.Fatalf("a due CA: %d CAs, certificate changed %v; want the successor beside it and the certificate kept", len(m.cas), m.cert != cert)
	}
	if changed, _ := m.renew(at.Add(caOverlap+time.Minute), hosts); !changed || m.cert.CheckSignatureFrom(m.cas[0]) != nil {
		t.Error("after the overlap: want the certificate signed by the new CA")
	}
	// The old CA expired: out of the bundle.
	if _, err := m.renew(ca.NotAfter.Add(time.Hour), hosts); err != nil || len(m.cas) != 1 || m.cas[0].Equal(ca) {
		t.Errorf("an expired CA: %d CAs left", len(m.cas))
	}
}

// TestDecodeBroken: a Secret whose key does not match its CA, or whose
// certificate does not parse, is made anew.
func TestDecodeBroken(t *testing.T) {
	now := time.Now()
	m := &material{}
	if _, err := m.renew(now, []string{"a.b.svc"}); err != nil {
		t.Fatal(err)
	}
	data := m.encode()
	data[keyCert] = []byte("garbage")
	d := decode(data)
	if d.cert != nil {
		t.Fatal("a garbage certificate decoded")
	}
	if changed, _ := d.renew(now, []string{"a.b.svc"}); !changed || d.cert == nil || d.cert.CheckSignatureFrom(d.cas[0]) != nil {
		t.Error("a garbage certificate: want a new one from the CA there")
	}
	other := &material{}
	_, _ = other.renew(now, []string{"a.b.svc"})
	data = m.encode()
	data[keyCAKey] = other.encode()[keyCAKey]
	if d := decode(data); d.caKey != nil {
		t.Error("a CA key of another CA was taken")
	}
}
