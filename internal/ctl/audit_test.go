package ctl

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The audit's command line: what it cannot work without is named, with
// the usage (exit 2) for a command line it does not understand and exit 1
// for a config it cannot use.
func TestAuditCommandLine(t *testing.T) {
	dir := t.TempDir()
	noSubnet := filepath.Join(dir, "no-subnet.yaml")
	if err := os.WriteFile(noSubnet, []byte("openstack:\n  endpoint: http://127.0.0.1:1/\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withRoutes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(withRoutes, []byte("openstack:\n  endpoint: http://127.0.0.1:1/\n  subnetID: s\nroutes:\n  routerID: r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"audit"}, 2, "-cloud-config is required"},
		{[]string{"audit", "-cloud-config", noSubnet, "-o", "yaml"}, 2, `-o "yaml": table or json`},
		{[]string{"audit", "-cloud-config", filepath.Join(dir, "missing.yaml")}, 1, "missing.yaml"},
		{[]string{"audit", "-cloud-config", noSubnet}, 1, "openstack.subnetID is required"},
		{[]string{"audit", "-cloud-config", withRoutes, "-block-ranges", "10.0.0.0/33"}, 2, `"10.0.0.0/33" is not a CIDR`},
		{[]string{"audit", "-cloud-config", withRoutes}, 2, "give -block-ranges"},
	} {
		var out, errb bytes.Buffer
		if code := Main(tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("vpcnictl %s: exit %d, stderr %q; want exit %d saying %q", strings.Join(tc.args, " "), code, errb.String(), tc.code, tc.says)
		}
	}
}
