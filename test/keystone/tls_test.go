package keystone

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	stdlog "log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// seen records the requests a test server (the TLS front, the proxy) saw.
type seen struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seen) add(r string) { s.mu.Lock(); s.reqs = append(s.reqs, r); s.mu.Unlock() }
func (s *seen) reset()       { s.mu.Lock(); s.reqs = nil; s.mu.Unlock() }
func (s *seen) has(prefix string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.reqs, func(r string) bool { return strings.HasPrefix(r, prefix) })
}
func (s *seen) String() string { s.mu.Lock(); defer s.mu.Unlock(); return strings.Join(s.reqs, "\n") }

// newCA makes a CA and a server certificate for 127.0.0.1 signed by it.
func newCA(t *testing.T) (caPEM []byte, server tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vpcni test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
}

// tlsFront serves HTTPS on a loopback port with cert: /v3 goes to
// Keystone, the rest to Neutron, both plain HTTP behind it.
func tlsFront(t *testing.T, cert tls.Certificate, keystone, neutron *url.URL, log *seen) string {
	t.Helper()
	ks, nt := httputil.NewSingleHostReverseProxy(keystone), httputil.NewSingleHostReverseProxy(neutron)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.add(r.Method + " " + r.URL.Path)
		if strings.HasPrefix(r.URL.Path, "/v3") {
			ks.ServeHTTP(w, r)
			return
		}
		nt.ServeHTTP(w, r)
	}), ErrorLog: stdlog.New(io.Discard, "", 0)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

// forwardProxy is an HTTP proxy on a loopback port: absolute-URI requests
// are forwarded, CONNECT tunnels; each is recorded.
func forwardProxy(t *testing.T, log *seen) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	direct := &http.Transport{Proxy: nil}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			log.add("CONNECT " + r.Host)
			up, err := net.Dial("tcp", r.Host)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				up.Close()
				return
			}
			_, _ = conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
			go func() { _, _ = io.Copy(up, buf); up.Close() }()
			_, _ = io.Copy(conn, up)
			conn.Close()
			return
		}
		log.add(r.Method + " " + r.URL.String())
		out := r.Clone(r.Context())
		out.RequestURI = ""
		resp, err := direct.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close(); direct.CloseIdleConnections() })
	return "http://" + ln.Addr().String()
}

// adminClient logs in as the fixture's admin (scripts/neutron.sh's
// bootstrap), for the catalog and the resources a member may not make.
func adminClient(t *testing.T, c context.Context) *gophercloud.ProviderClient {
	t.Helper()
	pc, err := gcos.AuthenticatedClient(c, gophercloud.AuthOptions{IdentityEndpoint: creds.AuthURL, Username: "admin", Password: "adminpw",
		DomainName: "Default", Scope: &gophercloud.AuthScope{ProjectName: "admin", DomainName: "Default"}})
	if err != nil {
		t.Fatalf("Keystone login as admin: %v", err)
	}
	return pc
}

// memberNetwork makes, as the member user, a network, a subnet and a VM
// port at 10.197.0.10, removed at the end.
func memberNetwork(t *testing.T, c context.Context, cidr, vmIP string) (subnetID string) {
	t.Helper()
	pc, err := gcos.AuthenticatedClient(c, gophercloud.AuthOptions{IdentityEndpoint: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret})
	if err != nil {
		t.Fatalf("Keystone login: %v", err)
	}
	nc, err := gcos.NewNetworkV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := networks.Create(c, nc, networks.CreateOpts{Name: "vpcni-keystone-tls"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNetwork(nc, n.ID) })
	sn, err := subnets.Create(c, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: cidr}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: n.ID, FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: vmIP}}}).Extract(); err != nil {
		t.Fatal(err)
	}
	return sn.ID
}

func deleteNetwork(nc *gophercloud.ServiceClient, id string) {
	if pages, err := ports.List(nc, ports.ListOpts{NetworkID: id}).AllPages(context.Background()); err == nil {
		all, _ := ports.ExtractPorts(pages)
		for _, p := range all {
			_ = ports.Delete(context.Background(), nc, p.ID).ExtractErr()
		}
	}
	_ = networks.Delete(context.Background(), nc, id).ExtractErr()
}

// captureLog sends slog's default logger to a buffer for the test.
func captureLog(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

// TestTLSProxyAndEndpointInterface: Keystone and Neutron behind an HTTPS
// front whose CA only the test knows, Neutron's catalog entry for
// interface internal pointing at that front:
//   - caBundle (a file, and inline) with endpointInterface internal: the
//     provider starts, and its Keystone and Neutron calls went through the
//     front (the catalog's internal URL was used);
//   - without caBundle: an x509 error that names caBundle and insecure;
//   - insecure: starts, with a warning in the log;
//   - endpointInterface admin (no such entry for Neutron): says so;
//   - proxy: a forwarding proxy sees the calls — plain ones as requests,
//     HTTPS ones as CONNECTs.
func TestTLSProxyAndEndpointInterface(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := adminClient(t, c)
	ic, err := gcos.NewIdentityV3(admin, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := gcos.NewNetworkV2(admin, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	neutronURL, _ := url.Parse(strings.TrimSuffix(pub.Endpoint, "/"))
	keystoneURL, _ := url.Parse(strings.TrimSuffix(creds.AuthURL, "/v3"))

	caPEM, cert := newCA(t)
	front := &seen{}
	frontURL := tlsFront(t, cert, keystoneURL, neutronURL, front)
	caFile := t.TempDir() + "/ca.pem"
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	pages, err := services.List(ic, services.ListOpts{ServiceType: "network"}).AllPages(c)
	if err != nil {
		t.Fatal(err)
	}
	svcs, _ := services.ExtractServices(pages)
	if len(svcs) != 1 {
		t.Fatalf("network services in the catalog: %+v", svcs)
	}
	ep, err := endpoints.Create(c, ic, endpoints.CreateOpts{Availability: gophercloud.AvailabilityInternal, Region: "RegionOne",
		URL: frontURL, ServiceID: svcs[0].ID}).Extract()
	if err != nil {
		t.Fatalf("add Neutron's internal endpoint: %v", err)
	}
	t.Cleanup(func() { _ = endpoints.Delete(context.Background(), ic, ep.ID).ExtractErr() })

	subnetID := memberNetwork(t, c, "10.197.0.0/24", "10.197.0.10")
	vm := netip.MustParseAddr("10.197.0.10")
	cfgWith := func(edit func(*openstack.Config)) openstack.Config {
		cfg := openstack.Config{SubnetID: subnetID, Auth: openstack.Auth{AuthURL: frontURL + "/v3",
			ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret}}
		edit(&cfg)
		cfg.Defaults()
		if err := cfg.Validate(); err != nil {
			t.Fatalf("config: %v", err)
		}
		return cfg
	}

	for name, ca := range map[string]string{"file": caFile, "inline": string(caPEM)} {
		front.reset()
		cfg := cfgWith(func(c *openstack.Config) { c.CABundle, c.EndpointInterface = ca, "internal" })
		if _, err := openstack.New(c, cfg, vm); err != nil {
			t.Fatalf("caBundle (%s), interface internal: %v", name, err)
		}
		if !front.has("POST /v3/auth/tokens") || !front.has("GET /v2.0/ports") {
			t.Fatalf("caBundle (%s): the front saw no login or no Neutron call:\n%s", name, front)
		}
		t.Logf("caBundle (%s), endpointInterface internal: started; the TLS front saw:\n%s", name, front)
	}

	_, err = openstack.New(c, cfgWith(func(*openstack.Config) {}), vm)
	if err == nil || !strings.Contains(err.Error(), "x509: certificate signed by unknown authority") ||
		!strings.Contains(err.Error(), "provider.openstack.caBundle") || !strings.Contains(err.Error(), "provider.openstack.insecure") {
		t.Fatalf("no caBundle: got %v, want an x509 error naming caBundle and insecure", err)
	}
	t.Logf("no caBundle: %v", err)

	logs := captureLog(t)
	if _, err := openstack.New(c, cfgWith(func(c *openstack.Config) { c.Insecure = true }), vm); err != nil {
		t.Fatalf("insecure: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "provider.openstack.insecure is set") {
		t.Fatalf("insecure: no warning logged:\n%s", logs)
	}
	t.Logf("insecure: started; logged: %s", strings.TrimSpace(logs.String()))

	_, err = openstack.New(c, cfgWith(func(c *openstack.Config) { c.CABundle, c.EndpointInterface = caFile, "admin" }), vm)
	if err == nil || !strings.Contains(err.Error(), "no Neutron endpoint of interface admin") {
		t.Fatalf("interface admin: got %v, want no Neutron endpoint of interface admin", err)
	}
	t.Logf("endpointInterface admin: %v", err)

	proxied := &seen{}
	proxy := forwardProxy(t, proxied)
	plain := cfgWith(func(c *openstack.Config) { c.Proxy = proxy })
	plain.Auth.AuthURL = creds.AuthURL
	if _, err := openstack.New(c, plain, vm); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	if !proxied.has("POST "+creds.AuthURL+"/auth/tokens") || !proxied.has("GET "+neutronURL.String()+"/v2.0/ports") {
		t.Fatalf("the proxy did not see the login and the Neutron calls:\n%s", proxied)
	}
	proxied.reset()
	if _, err := openstack.New(c, cfgWith(func(c *openstack.Config) { c.Proxy, c.CABundle, c.EndpointInterface = proxy, caFile, "internal" }), vm); err != nil {
		t.Fatalf("HTTPS through the proxy: %v", err)
	}
	if !proxied.has("CONNECT " + strings.TrimPrefix(frontURL, "https://")) {
		t.Fatalf("HTTPS through the proxy: no CONNECT to the front:\n%s", proxied)
	}
	t.Logf("HTTPS through the proxy: it saw\n%s", proxied)
}
