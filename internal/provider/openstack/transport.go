package openstack

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"golang.org/x/net/http/httpproxy"
)

// checkTransport names each bad TLS, proxy or catalog setting.
func (o *Config) checkTransport() []error {
	var errs []error
	if o.CABundle != "" {
		if _, err := o.caPool(); err != nil {
			errs = append(errs, err)
		}
		if o.Insecure {
			errs = append(errs, fmt.Errorf("insecure: true skips the verification caBundle is for: set one of them"))
		}
	}
	if o.Proxy != "" {
		if u, err := url.Parse(o.Proxy); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("proxy: %q is not an http(s) URL such as http://proxy.example:3128", o.Proxy))
		}
	}
	if _, err := o.availability(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// availability is endpointInterface as gophercloud's catalog lookup spells it.
func (o *Config) availability() (gophercloud.Availability, error) {
	switch o.EndpointInterface {
	case "", "public":
		return gophercloud.AvailabilityPublic, nil
	case "internal":
		return gophercloud.AvailabilityInternal, nil
	case "admin":
		return gophercloud.AvailabilityAdmin, nil
	}
	return "", fmt.Errorf("endpointInterface: %q is not one of public, internal, admin", o.EndpointInterface)
}

// caPool is the system's CAs and caBundle's (a path, or the PEM itself).
func (o *Config) caPool() (*x509.CertPool, error) {
	pem, where := []byte(o.CABundle), "caBundle (inline)"
	if !strings.HasPrefix(strings.TrimSpace(o.CABundle), "-----BEGIN") {
		if !filepath.IsAbs(o.CABundle) {
			return nil, fmt.Errorf("caBundle: %q is neither a PEM certificate nor an absolute path to a file of them", o.CABundle)
		}
		data, err := os.ReadFile(o.CABundle)
		if err != nil {
			return nil, fmt.Errorf("caBundle: cannot read %s: %w", o.CABundle, err)
		}
		pem, where = data, "caBundle "+o.CABundle
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: holds no PEM certificate (-----BEGIN CERTIFICATE-----)", where)
	}
	return pool, nil
}

// roundTripper is rt, or when rt is nil the transport cfg's settings make.
func (o *Config) roundTripper(rt http.RoundTripper) (http.RoundTripper, error) {
	if rt != nil {
		return rt, nil
	}
	return o.transport(slog.Default())
}

// transport is the HTTP transport of every call to Keystone, Neutron and
// Nova: Go's defaults with caBundle, insecure and proxy applied. Insecure
// is said at every connect, as a warning: it must not go unnoticed.
func (o *Config) transport(log *slog.Logger) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	// The environment is read at each connect (http.ProxyFromEnvironment
	// reads it once per process).
	env := httpproxy.FromEnvironment().ProxyFunc()
	t.Proxy = func(r *http.Request) (*url.URL, error) { return env(r.URL) }
	if o.Proxy != "" {
		u, err := url.Parse(o.Proxy)
		if err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
		t.Proxy = http.ProxyURL(u)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case o.Insecure:
		tc.InsecureSkipVerify = true
		log.Warn("provider.openstack.insecure is set: the certificates of Keystone, Neutron and Nova are NOT verified; " +
			"anyone on the path can read the credentials and change the answers (set caBundle to the cloud's CA instead)")
	case o.CABundle != "":
		pool, err := o.caPool()
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	t.TLSClientConfig = tc
	return t, nil
}
