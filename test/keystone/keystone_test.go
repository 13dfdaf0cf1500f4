// Package keystone runs the OpenStack provider through a real Keystone with
// an application credential, against the real neutron-server in Keystone
// mode (scripts/neutron.sh, KEYSTONE=1).
package keystone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// state is the fixture's directory: scripts/neutron.sh's NQ (its ports
// are NEUTRON_PORT and KEYSTONE_PORT, both read from the environment by
// the script), so a run can sit beside the shared API-mode neutron-server.
var state = envOr("NQ", "/var/tmp/vpcni-neutron")

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

var creds struct {
	AuthURL   string `json:"auth_url"`
	ProjectID string `json:"project_id"`
	ID        string `json:"application_credential_id"`
	Secret    string `json:"application_credential_secret"`
}

func TestMain(m *testing.M) {
	testbed.RequireRoot("the Keystone tests")
	script := func(arg string, env ...string) *exec.Cmd {
		c := exec.Command("bash", "../../scripts/neutron.sh", arg)
		c.Env = append(append(os.Environ(), "NQ="+state), env...)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		return c
	}
	// A Keystone-mode fixture already up (an earlier run's, kept) is
	// reused and left up; one this run starts is taken down.
	mode, _ := os.ReadFile(state + "/mode")
	wasUp := strings.TrimSpace(string(mode)) == "keystone" && script("status").Run() == nil
	err := script("up", "KEYSTONE=1").Run()
	code := 1
	if err == nil {
		data, rerr := os.ReadFile(state + "/keystone.json")
		if rerr == nil && json.Unmarshal(data, &creds) == nil {
			code = m.Run()
		} else {
			fmt.Println("vpcni-test: no application credential from Keystone:", rerr)
		}
	} else {
		fmt.Println("vpcni-test: could not start Keystone and neutron-server:", err)
	}
	if !wasUp {
		_ = script("down").Run()
	}
	os.Exit(code)
}

// TestApplicationCredential: the provider logs in with an application
// credential of a member user and assigns and releases addresses on that
// project's VM port.
func TestApplicationCredential(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Set the network up as the same member user would.
	pc, err := gcos.AuthenticatedClient(c, gophercloud.AuthOptions{IdentityEndpoint: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret})
	if err != nil {
		t.Fatalf("Keystone login: %v", err)
	}
	nc, err := gcos.NewNetworkV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := networks.Create(c, nc, networks.CreateOpts{Name: "vpcni-keystone"}).Extract()
	if err != nil {
		t.Fatalf("create network as the member user: %v", err)
	}
	t.Cleanup(func() {
		if pages, err := ports.List(nc, ports.ListOpts{NetworkID: n.ID}).AllPages(context.Background()); err == nil {
			all, _ := ports.ExtractPorts(pages)
			for _, p := range all {
				_ = ports.Delete(context.Background(), nc, p.ID).ExtractErr()
			}
		}
		_ = networks.Delete(context.Background(), nc, n.ID).ExtractErr()
	})
	sn, err := subnets.Create(c, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: "10.198.0.0/24"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	vm, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: n.ID, FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: "10.198.0.10"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}

	cfg := openstack.Config{SubnetID: sn.ID, Auth: openstack.Auth{AuthURL: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret}}
	cfg.Defaults()
	p, err := openstack.New(c, cfg, netip.MustParseAddr("10.198.0.10"))
	if err != nil {
		t.Fatalf("provider through Keystone: %v", err)
	}
	if p.PortID() != vm.ID {
		t.Fatalf("found port %s, want %s", p.PortID(), vm.ID)
	}
	got, err := p.Assign(c, provider.AssignRequest{Count: 3})
	if err != nil || len(got) != 3 {
		t.Fatalf("Assign(3) = %v, %v", got, err)
	}
	held, err := p.Held(c)
	if err != nil || !slices.Equal(held, got) {
		t.Fatalf("Held = %v, %v; want %v", held, err, got)
	}
	if err := p.Release(c, provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
	if held, err := p.Held(c); err != nil || len(held) != 0 {
		t.Fatalf("Held after Release = %v, %v; want none", held, err)
	}

	// The same through a credentials file, as a mounted Secret would give it.
	file := t.TempDir() + "/cloud.yaml"
	body := fmt.Sprintf("authURL: %s\napplicationCredentialID: %s\napplicationCredentialSecret: %s\n", creds.AuthURL, creds.ID, creds.Secret)
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	fcfg := openstack.Config{SubnetID: sn.ID, CredentialsFile: file}
	fcfg.Defaults()
	if _, err := openstack.New(c, fcfg, netip.MustParseAddr("10.198.0.10")); err != nil {
		t.Fatalf("provider with a credentials file: %v", err)
	}
}

// TestWrongCredentials: a wrong secret gets an error that says so, not a
// retry loop.
func TestWrongCredentials(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := openstack.Config{SubnetID: "any", Auth: openstack.Auth{AuthURL: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: "wrong"}}
	cfg.Defaults()
	_, err := openstack.New(c, cfg, netip.MustParseAddr("10.198.0.10"))
	if err == nil || !strings.Contains(err.Error(), "Keystone refused the credentials") || errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("wrong secret: %v", err)
	}
}
