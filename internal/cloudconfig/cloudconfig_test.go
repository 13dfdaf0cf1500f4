package cloudconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "cloud.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := Load(write("openstack:\n  endpoint: http://127.0.0.1:9696/\n  subnetID: ignored\n"))
	if err != nil || c.OpenStack.Endpoint != "http://127.0.0.1:9696/" || c.OpenStack.Timeout.Duration != 15*time.Second {
		t.Fatalf("a noauth endpoint: %+v, %v", c.OpenStack, err)
	}
	for body, want := range map[string][]string{
		"{}\n":                              {"openstack: the section is required"},
		"openstack:\n  timeout: 1ms\n":      {"openstack.auth", "openstack.timeout"},
		"openstack:\n  endpoint: ftp://x\n": {"openstack.endpoint"},
		"openstack:\n  endpoint: http://x/\n  bogus: 1\n": {"bogus"},
	} {
		_, err := Load(write(body))
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want it to name %s", body, err, w)
			}
		}
		if err != nil && strings.Contains(err.Error(), "subnetID") {
			t.Errorf("%q: %v names subnetID, which the controller does not need", body, err)
		}
	}
}
