// Package nova runs the provider's NIC modes (passthrough, secondary NICs)
// and the os-interface contract against a real Nova (Debian's Zed, fake
// virt driver) beside a real neutron-server with Keystone, started by
// scripts/nova.sh (docs/nova.md), as a member of a project — and proves
// the shared-network rule: on a network another project owns and shares,
// fixed-ips and address-pairs are refused at start naming the policy,
// passthrough works.
package nova

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	gcos "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/attachinterfaces"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/provider/providertest"
	"github.com/vpcni/vpcni/internal/testbed"
)

const (
	state = "/var/tmp/vpcni-nova/neutron"
	image = "11111111-2222-3333-4444-555555555555" // the Glance stub's
)

var (
	creds struct {
		AuthURL string `json:"auth_url"`
		ID      string `json:"application_credential_id"`
		Secret  string `json:"application_credential_secret"`
	}
	memberNC, memberCC, adminNC *gophercloud.ServiceClient
	flavor                      string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the real-Nova tests")
	code := 1
	up := exec.Command("bash", "../../scripts/nova.sh", "up")
	up.Stdout, up.Stderr = os.Stdout, os.Stderr
	if err := up.Run(); err != nil {
		fmt.Println("vpcni-test: could not start Nova beside neutron-server:", err)
	} else if err := connect(); err != nil {
		fmt.Println("vpcni-test:", err)
	} else {
		code = m.Run()
	}
	if os.Getenv("VPCNI_KEEP_NOVA") == "" {
		down := exec.Command("bash", "../../scripts/nova.sh", "down")
		down.Stdout, down.Stderr = os.Stdout, os.Stderr
		_ = down.Run()
	}
	os.Exit(code)
}

func connect() error {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data, err := os.ReadFile(state + "/keystone.json")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &creds); err != nil {
		return err
	}
	member, err := gcos.AuthenticatedClient(c, gophercloud.AuthOptions{IdentityEndpoint: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret})
	if err != nil {
		return fmt.Errorf("member login: %w", err)
	}
	admin, err := gcos.AuthenticatedClient(c, gophercloud.AuthOptions{IdentityEndpoint: creds.AuthURL, Username: "admin", Password: "adminpw", DomainName: "Default",
		Scope: &gophercloud.AuthScope{ProjectName: "admin", DomainName: "Default"}})
	if err != nil {
		return fmt.Errorf("admin login: %w", err)
	}
	if memberNC, err = gcos.NewNetworkV2(member, gophercloud.EndpointOpts{}); err != nil {
		return err
	}
	if memberCC, err = gcos.NewComputeV2(member, gophercloud.EndpointOpts{}); err != nil {
		return err
	}
	memberCC.Microversion = "2.37" // networks: "none"
	if adminNC, err = gcos.NewNetworkV2(admin, gophercloud.EndpointOpts{}); err != nil {
		return err
	}
	adminCC, err := gcos.NewComputeV2(admin, gophercloud.EndpointOpts{})
	if err != nil {
		return err
	}
	// A disk of 1: Nova refuses zero-disk flavors to members.
	disk := 1
	f, err := flavors.Create(c, adminCC, flavors.CreateOpts{Name: fmt.Sprintf("vpcni-%d", os.Getpid()), RAM: 64, VCPUs: 1, Disk: &disk}).Extract()
	if err != nil {
		return fmt.Errorf("create flavor: %w", err)
	}
	flavor = f.ID
	return nil
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

var seq atomic.Int64

// newServer boots a fake server without networks, waits for ACTIVE, and
// attaches primary as its NIC.
func newServer(t *testing.T, primary string) string {
	t.Helper()
	s, err := servers.Create(ctx(t), memberCC, servers.CreateOpts{Name: fmt.Sprintf("vpcni-vm-%d-%d", os.Getpid(), seq.Add(1)),
		ImageRef: image, FlavorRef: flavor, Networks: "none"}, nil).Extract()
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	t.Cleanup(func() { _ = servers.Delete(context.Background(), memberCC, s.ID).ExtractErr() })
	for start := time.Now(); ; time.Sleep(250 * time.Millisecond) {
		got, err := servers.Get(ctx(t), memberCC, s.ID).Extract()
		if err == nil && got.Status == "ACTIVE" {
			break
		}
		if err == nil && got.Status == "ERROR" || time.Since(start) > 2*time.Minute {
			t.Fatalf("server %s: %+v, %v", s.ID, got, err)
		}
	}
	if _, err := attachinterfaces.Create(ctx(t), memberCC, s.ID, attachinterfaces.CreateOpts{PortID: primary}).Extract(); err != nil {
		t.Fatalf("attach the VM port %s to %s: %v", primary, s.ID, err)
	}
	return s.ID
}

func memberAuth(cfg *openstack.Config) {
	cfg.Endpoint, cfg.ComputeEndpoint = "", ""
	cfg.Auth = openstack.Auth{AuthURL: creds.AuthURL, ApplicationCredentialID: creds.ID, ApplicationCredentialSecret: creds.Secret}
}

func endpoint() neutrontest.Endpoint {
	return neutrontest.Endpoint{NC: memberNC, Configure: memberAuth, Nova: &neutrontest.Nova{CC: memberCC, NewServer: newServer}}
}

// TestOSInterfaceContract: the lab's stand-in is held to this (novaapi).
func TestOSInterfaceContract(t *testing.T) {
	endpoint().RunOSInterface(t, "10.240.0.0/24")
}

// TestProviderNICContract: passthrough and secondary NICs through Keystone
// as a member, against real Nova and Neutron.
func TestProviderNICContract(t *testing.T) {
	providertest.RunNICs(t, endpoint())
}

// TestSharedNetwork: a network admin owns and shares. The member's
// provider refuses fixed-ips and address-pairs at start, naming the policy
// and passthrough; passthrough takes an address there and gives it back.
func TestSharedNetwork(t *testing.T) {
	shared := true
	n, err := networks.Create(ctx(t), adminNC, networks.CreateOpts{Name: "vpcni-shared", Shared: &shared}).Extract()
	if err != nil {
		t.Fatalf("admin creates a shared network: %v", err)
	}
	t.Cleanup(func() { neutrontest.Endpoint{NC: adminNC}.DeleteNetwork(n.ID) })
	sn, err := subnets.Create(ctx(t), adminNC, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: "10.241.0.0/24"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	// The member's VM on it: Neutron picks the address (a member may not).
	vm, err := ports.Create(ctx(t), memberNC, ports.CreateOpts{NetworkID: n.ID, FixedIPs: []ports.IP{{SubnetID: sn.ID}}}).Extract()
	if err != nil {
		t.Fatalf("member creates its VM port on the shared network: %v", err)
	}
	server := newServer(t, vm.ID)
	nodeIP := netip.MustParseAddr(vm.FixedIPs[0].IPAddress)
	open := func(mode string) (*openstack.Provider, error) {
		cfg := openstack.Config{SubnetID: sn.ID, Mode: mode}
		memberAuth(&cfg)
		cfg.Defaults()
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return openstack.New(ctx(t), cfg, nodeIP)
	}
	for mode, rule := range map[string]string{"fixed-ips": "update_port:fixed_ips", "address-pairs": "update_port:allowed_address_pairs"} {
		_, err := open(mode)
		if err == nil || !strings.Contains(err.Error(), rule) || !strings.Contains(err.Error(), "mode: passthrough") {
			t.Fatalf("mode %s on another project's shared network: %v; want a refusal naming %s and passthrough", mode, err, rule)
		}
		t.Logf("vpcni-test: %s refused: %v", mode, err)
	}
	p, err := open("passthrough")
	if err != nil {
		t.Fatalf("passthrough on the shared network: %v", err)
	}
	leases, err := p.Assign(ctx(t), provider.AssignRequest{Count: 1})
	if err != nil || len(leases) != 1 || leases[0].NIC == nil {
		t.Fatalf("passthrough Assign on the shared network = %+v, %v", leases, err)
	}
	att := neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}.Attached(t, server)
	if nic := att[leases[0].Interface]; !strings.EqualFold(nic.MAC, leases[0].NIC.MAC) {
		t.Fatalf("Nova lists %v on the server, want %s with MAC %s", att, leases[0].Interface, leases[0].NIC.MAC)
	}
	if err := p.Release(ctx(t), provider.Addresses(leases)); err != nil {
		t.Fatal(err)
	}
	after := neutrontest.Endpoint{Nova: &neutrontest.Nova{CC: memberCC}}.Attached(t, server)
	if _, still := after[leases[0].Interface]; still {
		t.Fatalf("the NIC is still attached after Release")
	}
}

// TestRefusalNamesNovaRule: Nova's own 403 (an admin-only API, the
// hypervisors, asked by the member) is read as vpcni reads a refused
// attach: the service, the rule Nova names, the call and the fix.
func TestRefusalNamesNovaRule(t *testing.T) {
	_, err := hypervisors.List(memberCC, nil).AllPages(ctx(t))
	d, ok := openstack.DeniedBy(err)
	if !ok {
		t.Fatalf("member listing hypervisors: %v, want a policy refusal", err)
	}
	if d.Service != "Nova" || d.Rule() != "os_compute_api:os-hypervisors:list-detail" ||
		!strings.Contains(d.Error(), "Nova's policy refused GET ") || !strings.Contains(d.Error(), "in Nova's policy") {
		t.Fatalf("Nova's refusal read as %+v: %s", d, d.Error())
	}
	t.Logf("Nova's 403 as vpcni says it: %s", d)
}
