package apiserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the fixture's certificates: one CA, the API server's serving
// certificate for 127.0.0.1, an admin client certificate (group
// system:masters: RBAC lets it do anything) and the service account
// signing key. Fresh each Start, valid for a day: nothing outlives a run.
type pki struct {
	dir                     string
	ca, adminCert, adminKey []byte
}

func (p pki) file(name string) string { return filepath.Join(p.dir, name) }

func writePKI(dir string) (pki, error) {
	p := pki{dir: dir}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vpcni-apiserver-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p.ca = pemBlock("CERTIFICATE", caDER)
	issue := func(serial int64, subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) (cert, key []byte, err error) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: subject,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips, DNSNames: dns}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kd, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, nil, err
		}
		return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", kd), nil
	}
	srvCert, srvKey, err := issue(2, pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)}, []string{"localhost", "kubernetes.default.svc"})
	if err != nil {
		return p, err
	}
	if p.adminCert, p.adminKey, err = issue(3, pkix.Name{CommonName: "vpcni-test-admin", Organization: []string{"system:masters"}},
		x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return p, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	saPriv, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return p, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return p, err
	}
	for name, data := range map[string][]byte{
		"ca.crt": p.ca, "apiserver.crt": srvCert, "apiserver.key": srvKey,
		"sa.key": pemBlock("EC PRIVATE KEY", saPriv), "sa.pub": pemBlock("PUBLIC KEY", saPub),
	} {
		if err := os.WriteFile(p.file(name), data, 0o600); err != nil {
			return p, err
		}
	}
	return p, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// kubeconfig is the admin's kubeconfig for url.
func (p pki) kubeconfig(url string) []byte {
	b := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: vpcni-apiserver
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: vpcni-apiserver
  context: {cluster: vpcni-apiserver, user: admin}
current-context: vpcni-apiserver
`, url, b(p.ca), b(p.adminCert), b(p.adminKey))
}
