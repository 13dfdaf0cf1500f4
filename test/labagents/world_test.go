package labagents

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/agents"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsbinding"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

// world is what the test builds in the real Neutron: a tenant network and
// subnet, an external flat network on the agents' physical network, a
// router between them (its qrouter- namespace made by the L3 agent), a
// security group open to ingress (port security — MAC and source
// addresses — stays on), and simulated VMs plugged into it.
type world struct {
	nc       *gophercloud.ServiceClient
	host     string // the agents' host: ports bound here are wired
	sgID     string
	netID    string
	subnetID string
	mtu      int
	gw       netip.Addr
	// subnet2ID is the network's second subnet (subnet2CIDR), whose
	// gateway gw2 is the router's too.
	subnet2ID string
	gw2       netip.Addr
	extNetID  string
	routerID  string
}

// vm is a simulated VM: a namespace whose eth0 (with the port's MAC and
// address) is the peer of tap<port-id[:11]> in the machine's namespace,
// which the linuxbridge agent enslaves to the network's brq bridge and
// guards with its iptables and ebtables rules — as Nova would plug it.
type vm struct {
	name   string
	ns     string
	ip     netip.Addr
	portID string
}

func (w *world) qrouterNS() string { return "qrouter-" + w.routerID }

// agentHost finds the host the live linuxbridge agent reports.
func agentHost(ctx context.Context, nc *gophercloud.ServiceClient) (string, error) {
	alive := true
	page, err := agents.List(nc, agents.ListOpts{AgentType: "Linux bridge agent", Alive: &alive}).AllPages(ctx)
	if err != nil {
		return "", err
	}
	all, err := agents.ExtractAgents(page)
	if err != nil {
		return "", err
	}
	if len(all) != 1 {
		return "", fmt.Errorf("want one live linuxbridge agent, Neutron lists %d", len(all))
	}
	return all[0].Host, nil
}

// extNetwork creates the external network: flat, on the physical network
// the linuxbridge agent maps to the script's veth.
type extNetwork struct{ name string }

func (o extNetwork) ToNetworkCreateMap() (map[string]any, error) {
	return map[string]any{"network": map[string]any{
		"name": o.name, "router:external": true,
		"provider:network_type": "flat", "provider:physical_network": physnet,
	}}, nil
}

func build(ctx context.Context, nc *gophercloud.ServiceClient) (*world, error) {
	w := &world{nc: nc}
	var err error
	if w.host, err = agentHost(ctx, nc); err != nil {
		return nil, err
	}
	sg, err := groups.Create(ctx, nc, groups.CreateOpts{Name: prefix + "-open", Description: "vpcni e2e: any ingress; anti-spoofing stays"}).Extract()
	if err != nil {
		return nil, fmt.Errorf("security group: %w", err)
	}
	w.sgID = sg.ID
	if _, err := rules.Create(ctx, nc, rules.CreateOpts{Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: sg.ID, RemoteIPPrefix: "0.0.0.0/0"}).Extract(); err != nil {
		return nil, fmt.Errorf("security group rule: %w", err)
	}

	var n struct {
		ID  string `json:"id"`
		MTU int    `json:"mtu"`
	}
	if err := networks.Create(ctx, nc, networks.CreateOpts{Name: prefix}).ExtractInto(&n); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	w.netID, w.mtu = n.ID, n.MTU
	prefix4 := netip.MustParsePrefix(subnetCIDR)
	w.gw = prefix4.Addr().Next()
	gw, dhcp := w.gw.String(), false
	sn, err := subnets.Create(ctx, nc, subnets.CreateOpts{
		Name: prefix, NetworkID: w.netID, IPVersion: gophercloud.IPv4, CIDR: subnetCIDR, GatewayIP: &gw, EnableDHCP: &dhcp,
		// vpcni takes pod addresses from the pool; the VMs' and the
		// test's spare addresses sit above it.
		AllocationPools: []subnets.AllocationPool{{Start: at(2).String(), End: at(199).String()}},
	}).Extract()
	if err != nil {
		return nil, fmt.Errorf("subnet: %w", err)
	}
	w.subnetID = sn.ID

	ext, err := networks.Create(ctx, nc, extNetwork{name: prefix + "-ext"}).Extract()
	if err != nil {
		return nil, fmt.Errorf("external network: %w", err)
	}
	w.extNetID = ext.ID
	extGWs := extGW.String()
	if _, err := subnets.Create(ctx, nc, subnets.CreateOpts{
		Name: prefix + "-ext", NetworkID: ext.ID, IPVersion: gophercloud.IPv4, CIDR: extCIDR, GatewayIP: &extGWs, EnableDHCP: &dhcp,
		AllocationPools: []subnets.AllocationPool{{Start: "203.0.113.10", End: "203.0.113.100"}},
	}).Extract(); err != nil {
		return nil, fmt.Errorf("external subnet: %w", err)
	}
	r, err := routers.Create(ctx, nc, routers.CreateOpts{Name: prefix, GatewayInfo: &routers.GatewayInfo{NetworkID: ext.ID}}).Extract()
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	w.routerID = r.ID
	if _, err := routers.AddInterface(ctx, nc, r.ID, routers.AddInterfaceOpts{SubnetID: sn.ID}).Extract(); err != nil {
		return nil, fmt.Errorf("router interface: %w", err)
	}
	w.gw2 = netip.MustParsePrefix(subnet2CIDR).Addr().Next()
	gw2 := w.gw2.String()
	sn2, err := subnets.Create(ctx, nc, subnets.CreateOpts{
		Name: prefix + "-2", NetworkID: w.netID, IPVersion: gophercloud.IPv4, CIDR: subnet2CIDR, GatewayIP: &gw2, EnableDHCP: &dhcp,
		AllocationPools: []subnets.AllocationPool{{Start: at2(2).String(), End: at2(199).String()}},
	}).Extract()
	if err != nil {
		return nil, fmt.Errorf("second subnet: %w", err)
	}
	w.subnet2ID = sn2.ID
	if _, err := routers.AddInterface(ctx, nc, r.ID, routers.AddInterfaceOpts{SubnetID: sn2.ID}).Extract(); err != nil {
		return nil, fmt.Errorf("router interface on the second subnet: %w", err)
	}
	return w, nil
}

// subnetOf is the subnet of the tenant network that ip is in: its ID,
// prefix and gateway.
func (w *world) subnetOf(ip netip.Addr) (id string, p netip.Prefix, gw netip.Addr) {
	if p := netip.MustParsePrefix(subnet2CIDR); p.Contains(ip) {
		return w.subnet2ID, p, w.gw2
	}
	return w.subnetID, netip.MustParsePrefix(subnetCIDR), w.gw
}

// at is the address with last octet b in the tenant subnet, at2 in its
// second subnet.
func at(b byte) netip.Addr  { return withLast(subnetCIDR, b) }
func at2(b byte) netip.Addr { return withLast(subnet2CIDR, b) }

func withLast(cidr string, b byte) netip.Addr {
	a := netip.MustParsePrefix(cidr).Addr().As4()
	a[3] = b
	return netip.AddrFrom4(a)
}

// plug creates a VM port bound to the agents' host and the namespace
// behind it. The device owner is neither compute:* (the agent would leave
// the tap to Nova) nor network:* (trusted: no port security).
func (w *world) plug(ctx context.Context, name string, ip netip.Addr) (*vm, error) {
	subnetID, subnet, gw := w.subnetOf(ip)
	p, err := ports.Create(ctx, w.nc, portsbinding.CreateOptsExt{
		CreateOptsBuilder: ports.CreateOpts{
			Name: prefix + "-" + name, NetworkID: w.netID, DeviceOwner: "vpcni-e2e:vm", DeviceID: prefix + "-" + name,
			FixedIPs:       []ports.IP{{SubnetID: subnetID, IPAddress: ip.String()}},
			SecurityGroups: &[]string{w.sgID},
		},
		HostID: w.host,
	}).Extract()
	if err != nil {
		return nil, fmt.Errorf("port for %s: %w", name, err)
	}
	v := &vm{name: name, ns: prefix + "-" + name, ip: ip, portID: p.ID}
	if err := netnsutil.Add(v.ns); err != nil {
		return nil, err
	}
	tap, mtu := "tap"+p.ID[:11], fmt.Sprint(w.mtu)
	if err := run("ip", "link", "add", tap, "mtu", mtu, "type", "veth", "peer", "name", "eth0", "netns", v.ns, "address", p.MACAddress, "mtu", mtu); err != nil {
		return nil, err
	}
	if err := run("ip", "link", "set", tap, "up"); err != nil {
		return nil, err
	}
	for _, c := range [][]string{
		{"ip", "addr", "add", fmt.Sprintf("%s/%d", ip, subnet.Bits()), "dev", "eth0"},
		{"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", "default", "via", gw.String()},
	} {
		if err := netnsutil.Exec(v.ns, c...); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// run runs a command in the test's own (the machine's) namespace.
func run(argv ...string) error {
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// waitActive waits until the agent reports the port wired.
func (w *world) waitActive(ctx context.Context, v *vm) error {
	for {
		p, err := ports.Get(ctx, w.nc, v.portID).Extract()
		if err == nil && p.Status == "ACTIVE" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("port of %s is not ACTIVE (%v): is the linuxbridge agent wiring it? %w", v.name, err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// setOnPort puts an address on a port or takes it off, as a person would
// (If-Match, re-read on 412).
func (w *world) setOnPort(ctx context.Context, portID string, ip netip.Addr, on bool) error {
	for range 10 {
		p, err := ports.Get(ctx, w.nc, portID).Extract()
		if err != nil {
			return err
		}
		var fixed []ports.IP
		for _, f := range p.FixedIPs {
			if f.IPAddress != ip.String() {
				fixed = append(fixed, f)
			}
		}
		if on {
			subnetID, _, _ := w.subnetOf(ip)
			fixed = append(fixed, ports.IP{SubnetID: subnetID, IPAddress: ip.String()})
		}
		rev := p.RevisionNumber
		_, err = ports.Update(ctx, w.nc, portID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if err == nil {
			return nil
		}
		if !gophercloud.ResponseCodeIs(err, 412) {
			return err
		}
	}
	return errors.New("port kept changing under the update")
}

// onPort says whether ip is a fixed IP of the port.
func (w *world) onPort(ctx context.Context, portID string, ip netip.Addr) (bool, error) {
	p, err := ports.Get(ctx, w.nc, portID).Extract()
	if err != nil {
		return false, err
	}
	for _, f := range p.FixedIPs {
		if f.IPAddress == ip.String() {
			return true, nil
		}
	}
	return false, nil
}

// sweep removes everything of this test from Neutron and the machine —
// after a run, and before one in case a crashed run left things behind:
// floating IPs, the router (interfaces first), ports, networks, the
// security group, and the namespaces (their veths, taps included, go with
// them).
func sweep(ctx context.Context, nc *gophercloud.ServiceClient) error {
	var errs []error
	keep := func(err error) {
		if err != nil && !gophercloud.ResponseCodeIs(err, 404) {
			errs = append(errs, err)
		}
	}
	if page, err := floatingips.List(nc, floatingips.ListOpts{}).AllPages(ctx); err == nil {
		fips, _ := floatingips.ExtractFloatingIPs(page)
		for _, f := range fips {
			// This test's own, and those marked for its pods as
			// vpcni-controller marks them.
			if f.Description == prefix || strings.HasPrefix(f.Description, "vpcni pod="+prefix+"/") {
				keep(floatingips.Delete(ctx, nc, f.ID).ExtractErr())
			}
		}
	} else {
		keep(err)
	}
	if page, err := routers.List(nc, routers.ListOpts{Name: prefix}).AllPages(ctx); err == nil {
		rs, _ := routers.ExtractRouters(page)
		for _, r := range rs {
			if page, err := ports.List(nc, ports.ListOpts{DeviceID: r.ID, DeviceOwner: "network:router_interface"}).AllPages(ctx); err == nil {
				ifs, _ := ports.ExtractPorts(page)
				for _, p := range ifs {
					_, err := routers.RemoveInterface(ctx, nc, r.ID, routers.RemoveInterfaceOpts{PortID: p.ID}).Extract()
					keep(err)
				}
			}
			keep(routers.Delete(ctx, nc, r.ID).ExtractErr())
		}
	} else {
		keep(err)
	}
	if page, err := ports.List(nc, ports.ListOpts{}).AllPages(ctx); err == nil {
		ps, _ := ports.ExtractPorts(page)
		for _, p := range ps {
			// The test's own, and the NICs vpcnid made for its VMs
			// (vpcni-<kind>-<instance>).
			if strings.HasPrefix(p.Name, prefix+"-") || strings.HasPrefix(p.Name, "vpcni-") && strings.HasSuffix(p.Name, "-"+prefix+"-n1") {
				keep(ports.Delete(ctx, nc, p.ID).ExtractErr())
			}
		}
	} else {
		keep(err)
	}
	var bridges []string
	if page, err := networks.List(nc, networks.ListOpts{}).AllPages(ctx); err == nil {
		ns, _ := networks.ExtractNetworks(page)
		for _, n := range ns {
			if n.Name == prefix || strings.HasPrefix(n.Name, prefix+"-") {
				keep(networks.Delete(ctx, nc, n.ID).ExtractErr())
				bridges = append(bridges, "brq"+n.ID[:11])
			}
		}
	} else {
		keep(err)
	}
	// Give the agent the time to remove the networks' bridges, so a
	// neutron.sh down right after the test does not stop it halfway.
	_, _ = eventually(30*time.Second, func() error {
		for _, b := range bridges {
			if run("ip", "link", "show", b) == nil {
				return fmt.Errorf("%s still there", b)
			}
		}
		return nil
	})
	for _, name := range []string{prefix + "-open", prefix + "-web"} {
		if page, err := groups.List(nc, groups.ListOpts{Name: name}).AllPages(ctx); err == nil {
			sgs, _ := groups.ExtractGroups(page)
			for _, g := range sgs {
				keep(groups.Delete(ctx, nc, g.ID).ExtractErr())
			}
		} else {
			keep(err)
		}
	}
	for _, ns := range netnsutil.List(prefix + "-") {
		keep(netnsutil.Delete(ns))
	}
	return errors.Join(errs...)
}

// nodeConfig is vpcnid's config for VM v as these tests run it: its node
// name, its socket and state under runDir/<v's name>, no metrics, no
// cooldown, and a pool that holds nothing spare (one address per ADD).
func nodeConfig(runDir string, v *vm, nodeName string) config.Config {
	cfg := config.Defaults()
	cfg.NodeName = nodeName
	cfg.SocketPath = filepath.Join(runDir, v.name, "vpcnid.sock")
	cfg.StateDir = filepath.Join(runDir, v.name, "state")
	cfg.MetricsAddr = ""
	cfg.Cooldown = config.Duration{}
	cfg.Pool = config.Pool{WarmTarget: 0, BatchSize: 1, MaxFree: 0, AddWait: config.Duration{Duration: time.Minute}}
	return cfg
}

// startNode starts vpcnid on VM v with cfg, stopped when the test ends
// (its log printed if the test failed), and a CNI runner for its socket.
func startNode(t *testing.T, runDir string, v *vm, cfg config.Config) (*testbed.Agent, *testbed.CNI) {
	t.Helper()
	agent, err := testbed.StartAgentIn(runDir, v.ns, binDir, cfg)
	if err != nil {
		t.Fatalf("vpcnid on %s: %v", v.name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(agent.LogPath)
			t.Logf("%s's vpcnid log:\n%s", v.name, log)
		}
		_ = agent.Stop()
	})
	cni, err := testbed.NewCNIIn(v.ns, []string{binDir}, filepath.Join(runDir, v.name, "cache"), testbed.VpcniConfList("1.0.0", prefix, cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	return agent, cni
}
