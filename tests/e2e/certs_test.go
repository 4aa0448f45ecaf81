package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// tlsFiles are PEM files of a throwaway PKI made for one test: a CA, a
// server certificate for 127.0.0.1/localhost, a client certificate the CA
// signed, and a "rogue" client certificate from an unrelated CA.
type tlsFiles struct {
	caCert                string
	serverCert, serverKey string
	clientCert, clientKey string
	rogueCert, rogueKey   string
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTLSFiles(t *testing.T) *tlsFiles {
	t.Helper()
	dir := t.TempDir()
	f := &tlsFiles{}

	ca := newCA(t, "engram-e2e-ca")
	f.caCert = writePEM(t, dir, "ca.crt", "CERTIFICATE", ca.cert.Raw)

	f.serverCert, f.serverKey = issue(t, dir, "server", ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "engram-e2e-server"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	f.clientCert, f.clientKey = issue(t, dir, "client", ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-etcd-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	rogueCA := newCA(t, "not-the-engram-ca")
	f.rogueCert, f.rogueKey = issue(t, dir, "rogue", rogueCA, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver-etcd-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return f
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newCA(t *testing.T, name string) issuer {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return issuer{cert: cert, key: key}
}

// issue signs tmpl with ca and writes NAME.crt and NAME.key.
func issue(t *testing.T, dir, name string, ca issuer, tmpl *x509.Certificate) (certPath, keyPath string) {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name+".crt", "CERTIFICATE", der), writePEM(t, dir, name+".key", "EC PRIVATE KEY", keyDER)
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// clientConfig trusts the test CA and, with withCert, presents the client
// certificate the CA signed.
func (f *tlsFiles) clientConfig(t *testing.T, withCert bool) *tls.Config {
	t.Helper()
	tc := &tls.Config{RootCAs: f.pool(t), MinVersion: tls.VersionTLS12}
	if withCert {
		tc.Certificates = []tls.Certificate{f.keyPair(t, f.clientCert, f.clientKey)}
	}
	return tc
}

// rogueClientConfig trusts the test CA but presents a certificate from a CA
// the server does not trust.
func (f *tlsFiles) rogueClientConfig(t *testing.T) *tls.Config {
	t.Helper()
	return &tls.Config{
		RootCAs:      f.pool(t),
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{f.keyPair(t, f.rogueCert, f.rogueKey)},
	}
}

func (f *tlsFiles) pool(t *testing.T) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(f.caCert)
	if err != nil {
		t.Fatal(err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		t.Fatal("test CA: no certificate in PEM")
	}
	return p
}

func (f *tlsFiles) keyPair(t *testing.T, cert, key string) tls.Certificate {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}
