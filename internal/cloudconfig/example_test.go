package cloudconfig_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cloud.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The example Secret's cloud.yaml loads; a bad file names every problem.
func TestExampleRoutes(t *testing.T) {
	data, err := os.ReadFile("../../deploy/examples/controller-routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var secret struct {
		StringData map[string]string `json:"stringData"`
	}
	if err := yaml.Unmarshal(data, &secret); err != nil {
		t.Fatal(err)
	}
	c, err := cloudconfig.Load(write(t, secret.StringData["cloud.yaml"]))
	if err != nil {
		t.Fatalf("the example: %v", err)
	}
	if !c.HasRoutes() || c.Routes.MaxRoutes != 30 || c.Settings.(*cluster.Settings).MaxAddressPairs != 10 || c.Routes.Resync.Duration.String() != "30s" {
		t.Errorf("%+v %+v", c.Routes, c.Settings)
	}
	_, err = cloudconfig.Load(write(t, "openstack: {endpoint: ftp://x}\nroutes: {maxRoutes: -1, resync: 1ms}\n"))
	for _, want := range []string{"routes.routerID", "routes.maxRoutes", "routes.resync", "openstack.endpoint"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "subnetID") {
		t.Errorf("subnetID is optional for the controller: %v", err)
	}
}

// The openstack section: the agent's provider section, subnetID optional,
// every bad field named under openstack.
func TestOpenStackSection(t *testing.T) {
	c, err := cloudconfig.Load(write(t, "openstack:\n  endpoint: http://127.0.0.1:9696/\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Settings.(*cluster.Settings)
	if c.Cloud != "openstack" || s.Endpoint != "http://127.0.0.1:9696/" || s.Timeout.Duration != 15*time.Second || c.HasRoutes() {
		t.Fatalf("a noauth endpoint: %+v, %+v", c, s)
	}
	if info := c.Open(nil).Info(); info.Name != "openstack" || info.Subnet || info.SubnetKey != "openstack.subnetID" {
		t.Errorf("without subnetID: %+v", info)
	}
	c, err = cloudconfig.Load(write(t, "openstack:\n  endpoint: http://127.0.0.1:9696/\n  subnetID: s1\n"))
	if err != nil || !c.Open(nil).Info().Subnet {
		t.Errorf("with subnetID: %v", err)
	}
	for body, want := range map[string][]string{
		"openstack:\n  timeout: 1ms\n":                    {"openstack.auth", "openstack.timeout"},
		"openstack:\n  endpoint: ftp://x\n":               {"openstack.endpoint"},
		"openstack:\n  endpoint: http://x/\n  bogus: 1\n": {"bogus"},
		"openstack:\n": {"openstack.auth"},
	} {
		_, err := cloudconfig.Load(write(t, body))
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
