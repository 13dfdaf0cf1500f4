package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	_ "github.com/vpcni/vpcni/internal/builtin"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// deploy/vpcnid.yaml must load as shipped, and after the change it and
// deploy/secret.yaml tell the user of a Neutron without Keystone to make:
// endpoint instead of credentialsFile, never both.
func TestShippedDeployConfigLoads(t *testing.T) {
	t.Setenv("VPCNI_NODE_NAME", "node-a")   // the DaemonSet sets both
	t.Setenv("VPCNI_HOST_IP", "192.0.2.10") // (status.hostIP)
	data, err := os.ReadFile("../../deploy/vpcnid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const credLine = "    credentialsFile: /etc/vpcni/cloud/credentials.yaml\n"
	const endpointLine = "    # endpoint: http://neutron.example:9696/\n"
	shipped := string(data)
	if !strings.Contains(shipped, credLine) || !strings.Contains(shipped, endpointLine) {
		t.Fatalf("deploy/vpcnid.yaml no longer has the lines its comments tell the user to change:\n%s", shipped)
	}
	load := func(body string) (config.Config, error) {
		path := filepath.Join(t.TempDir(), "vpcnid.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return config.Load(path)
	}
	uncommented := strings.Replace(shipped, endpointLine, strings.Replace(endpointLine, "# ", "", 1), 1)

	// The credentials file is read when the config loads: as the shipped
	// Secret leaves it (comments only), it is named as empty; filled in,
	// the config loads.
	secret, err := os.ReadFile("../../deploy/secret.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(secret), "  credentials.yaml: |\n")
	if !ok {
		t.Fatal("deploy/secret.yaml has no credentials.yaml")
	}
	creds := filepath.Join(t.TempDir(), "credentials.yaml")
	write := func(body string) {
		if err := os.WriteFile(creds, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(body)
	withCreds := strings.Replace(shipped, credLine, "    credentialsFile: "+creds+"\n", 1)
	if _, err := load(withCreds); err == nil || !strings.Contains(err.Error(), "provider.openstack.credentialsFile: credentials file "+creds+" is empty (only comments)") {
		t.Fatalf("as shipped, with the Secret as shipped: got %v, want the credentials file named as empty", err)
	}
	filled := strings.NewReplacer("# authURL", "authURL", "# applicationCredentialID: ...", "applicationCredentialID: id",
		"# applicationCredentialSecret: ...", "applicationCredentialSecret: secret").Replace(body)
	write(filled)
	cfg, err := load(withCreds)
	if err != nil {
		t.Fatalf("as shipped, with the Secret's application credential filled in:\n%s\n%v", filled, err)
	}
	if o, ok := cfg.Provider.Settings.(*openstack.Config); !ok || o.CredentialsFile == "" || o.Endpoint != "" {
		t.Fatalf("as shipped: want credentialsFile and no endpoint, got %+v", o)
	}
	if cfg.MetricsAddr != "192.0.2.10:9695" {
		t.Errorf("as shipped: metricsAddr %q, want the node's address (VPCNI_HOST_IP) and 9695", cfg.MetricsAddr)
	}

	cfg, err = load(strings.Replace(uncommented, credLine, "", 1))
	if err != nil {
		t.Fatalf("endpoint instead of credentialsFile: %v", err)
	}
	if o, ok := cfg.Provider.Settings.(*openstack.Config); !ok || o.Endpoint != "http://neutron.example:9696/" || o.CredentialsFile != "" {
		t.Fatalf("endpoint instead of credentialsFile: got %+v", o)
	}

	if _, err := load(uncommented); err == nil || !strings.Contains(err.Error(), "provider.openstack.endpoint") {
		t.Fatalf("endpoint with credentialsFile: got %v, want the endpoint refused", err)
	}
}
