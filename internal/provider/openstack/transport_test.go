package openstack

import (
	"log/slog"
	"net/http"
	"net/url"
	"testing"
)

// Without proxy, HTTPS_PROXY and NO_PROXY of the environment apply, read
// at each connect; with it, every call goes through it.
func TestProxyFromSettingOrEnvironment(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://env-proxy.example:3128")
	t.Setenv("NO_PROXY", "neutron.internal.example")
	proxyOf := func(cfg Config, target string) string {
		t.Helper()
		tr, err := cfg.transport(slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(target)
		p, err := tr.Proxy(&http.Request{URL: u})
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			return ""
		}
		return p.String()
	}
	if got := proxyOf(Config{}, "https://keystone.example:5000/v3"); got != "http://env-proxy.example:3128" {
		t.Errorf("HTTPS_PROXY: %q", got)
	}
	if got := proxyOf(Config{}, "https://neutron.internal.example:9696/"); got != "" {
		t.Errorf("NO_PROXY: %q, want direct", got)
	}
	set := Config{Proxy: "http://proxy.example:8080"}
	for _, target := range []string{"https://keystone.example:5000/v3", "https://neutron.internal.example:9696/", "http://127.0.0.1:9696/"} {
		if got := proxyOf(set, target); got != "http://proxy.example:8080" {
			t.Errorf("proxy set, %s: %q", target, got)
		}
	}
}
