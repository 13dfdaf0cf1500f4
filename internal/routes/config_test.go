package routes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The example Secret's cloud.yaml loads; a bad file names every problem.
func TestCloudConfig(t *testing.T) {
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
	dir := t.TempDir()
	good := filepath.Join(dir, "cloud.yaml")
	if err := os.WriteFile(good, []byte(secret.StringData["cloud.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadCloudConfig(good)
	if err != nil {
		t.Fatalf("the example: %v", err)
	}
	if c.Routes.MaxRoutes != 30 || c.OpenStack.MaxAddressPairs != 10 || c.Routes.Resync.Duration.String() != "30s" {
		t.Errorf("%+v", c.Routes)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("openstack: {endpoint: ftp://x}\nroutes: {maxRoutes: -1, resync: 1ms}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadCloudConfig(bad)
	for _, want := range []string{"routes.routerID", "routes.maxRoutes", "routes.resync", "endpoint"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "subnetID") {
		t.Errorf("subnetID is optional for the controller: %v", err)
	}
}
