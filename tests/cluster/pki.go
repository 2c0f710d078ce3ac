package main

// The cluster's certificates: one CA signs every serving and client certificate, and an
// RSA key signs the service account tokens. Everything is generated at start-up into the
// data directory and thrown away with it.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is where the generated files are.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// certPair names a certificate and its key on disk.
type certPair struct {
	Cert string
	Key  string
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// CAFile is the CA every component trusts.
func (p *pki) CAFile() string { return p.path("ca.crt") }

// newPKI creates the CA and the service account key pair in dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "captf-envtest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{dir: dir, caCert: cert, caKey: key}
	if err := writePEM(p.CAFile(), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	// Service account tokens: kube-apiserver verifies them with the public key, the
	// token controller and the TokenRequest API sign with the private one.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.key"), "PRIVATE KEY", pkcs8); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.pub"), "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

var serial int64 = 1

// issue signs a certificate named name: a client certificate for the user cn in the
// groups orgs, and a serving one when hosts (IP addresses or DNS names) are given.
func (p *pki) issue(name, cn string, orgs []string, hosts []string) (certPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certPair{}, err
	}
	serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return certPair{}, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return certPair{}, err
	}
	pair := certPair{Cert: p.path(name + ".crt"), Key: p.path(name + ".key")}
	if err := writePEM(pair.Cert, "CERTIFICATE", der); err != nil {
		return certPair{}, err
	}
	if err := writePEM(pair.Key, "PRIVATE KEY", pkcs8); err != nil {
		return certPair{}, err
	}
	return pair, nil
}

func writePEM(path, typ string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// kubeconfig renders a kubeconfig for server with the client certificate pair, every
// file embedded so that the kubeconfig can be copied anywhere.
func kubeconfig(server, caFile string, pair certPair, user string) ([]byte, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	crt, err := os.ReadFile(pair.Cert)
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(pair.Key)
	if err != nil {
		return nil, err
	}
	b64 := func(b []byte) string { return base64Std(b) }
	return []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: captf-envtest
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: captf-envtest
  context:
    cluster: captf-envtest
    user: %s
current-context: captf-envtest
`, server, b64(ca), user, b64(crt), b64(key), user)), nil
}
