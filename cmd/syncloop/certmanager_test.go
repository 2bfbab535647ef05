package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/syncloop/syncloop/rules"
)

// selfSigned is a certificate for 127.0.0.1 signed by itself, and its key,
// as PEM: what cert-manager's selfSigned Issuer writes.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// TestConversionWebhookCertManager: with --webhook-cert-manager, syncloop
// serves the certificate cert-manager issued into the Secret and never
// writes it, and the CRD asks cert-manager's CA injector for its CA
// bundle instead of carrying syncloop's; once the injector (played here)
// has put it, the kind converts, and syncloop leaves the bundle alone.
//
// API server: a CRD converting through a webhook whose CA bundle another
// manager keeps.
func TestConversionWebhookCertManager(t *testing.T) {
	env, cs, dc := clients(t)
	ctx := t.Context()
	ns := newNamespace(t, cs, "certmanager")
	certPEM, keyPEM := selfSigned(t)
	secret, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "syncloop-webhook-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": certPEM}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hook := freeAddr(t)
	file := writeFile(t, t.TempDir(), "gadget.yaml", strings.ReplaceAll(versionedRule, "conversion.syncloop.dev", "cm.syncloop.dev"))
	_, probes := runInProcess(t, "-f", file, "--kubeconfig", env.Kubeconfig(), "--leader-elect-namespace", ns,
		"--webhook-bind-address", hook, "--webhook-url", "https://"+hook+rules.WebhookPath, "--webhook-cert-manager", ns+"/syncloop-webhook")
	readyz, poll := probing(t, probes, 60*time.Second)
	poll("the webhook serving cert-manager's certificate", func() bool {
		return strings.Contains(readyz(), "conversion webhook: serving ")
	})
	crds := dc.Resource(crdGVR)
	var crd *unstructured.Unstructured
	poll("the CRD asking the CA injector", func() bool {
		crd, err = crds.Get(ctx, "gadgets.cm.syncloop.dev", metav1.GetOptions{})
		return err == nil && crd.GetAnnotations()["cert-manager.io/inject-ca-from"] == ns+"/syncloop-webhook"
	})
	if b, _, _ := unstructured.NestedString(crd.Object, "spec", "conversion", "webhook", "clientConfig", "caBundle"); b != "" {
		t.Error("the CRD carries a CA bundle of syncloop's")
	}
	// The CA injector puts the Certificate's CA.
	patch := `{"spec":{"conversion":{"webhook":{"clientConfig":{"caBundle":"` + base64.StdEncoding.EncodeToString(certPEM) + `"}}}}}`
	if _, err := crds.Patch(ctx, "gadgets.cm.syncloop.dev", types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "cainjector"}); err != nil {
		t.Fatal(err)
	}
	gadgets := func(v string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "cm.syncloop.dev", Version: v, Resource: "gadgets"}
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cm.syncloop.dev/v1alpha1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g"}, "spec": map[string]any{"size": int64(3), "image": "web:2"}}}
	pollUntil(t, 30*time.Second, "a v1alpha1 object written through the webhook", func() bool {
		_, err := dc.Resource(gadgets("v1alpha1")).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		return err == nil
	})
	got, err := dc.Resource(gadgets("v1")).Namespace(ns).Get(ctx, "g", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas"); r != 3 {
		t.Errorf("read in v1: replicas %d", r)
	}
	after, err := cs.CoreV1().Secrets(ns).Get(ctx, "syncloop-webhook-tls", metav1.GetOptions{})
	if err != nil || after.ResourceVersion != secret.ResourceVersion {
		t.Errorf("syncloop wrote cert-manager's Secret (resourceVersion %s → %s): %v", secret.ResourceVersion, after.ResourceVersion, err)
	}
	crd, err = crds.Get(ctx, "gadgets.cm.syncloop.dev", metav1.GetOptions{})
	if b, _, _ := unstructured.NestedString(crd.Object, "spec", "conversion", "webhook", "clientConfig", "caBundle"); err != nil || b == "" {
		t.Errorf("the injector's CA bundle is gone from the CRD: %v", err)
	}
}
