package ctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// neutronBed is a benchmark bed on a real Neutron: a network and subnet of
// its own, and a testbed node whose VM port lives in that subnet, running
// vpcnid with the openstack provider through a forwarder.
type neutronBed struct {
	nc       *gophercloud.ServiceClient
	endpoint string
	netID    string
	subnetID string
	osCfg    openstack.Config
	tb       *testbed.Topology
	fwd      net.Listener
	bin      string
}

// newNeutronBed creates the network (cidr must hold the testbed's /24) and
// the testbed; close removes both.
func newNeutronBed(ctx context.Context, endpoint, prefix, cidr string) (b *neutronBed, err error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	b = &neutronBed{endpoint: endpoint, bin: bin, nc: openstack.NoAuthClient(endpoint, http.Client{Timeout: 30 * time.Second})}
	n, err := networks.Create(ctx, b.nc, networks.CreateOpts{Name: prefix}).Extract()
	if err != nil {
		return nil, fmt.Errorf("Neutron at %s: %w (start it with scripts/neutron.sh up)", endpoint, err)
	}
	b.netID = n.ID
	bed := b // a failed return sets b to nil
	defer func() {
		if err != nil {
			bed.close()
		}
	}()
	sn, err := subnets.Create(ctx, b.nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: cidr}).Extract()
	if err != nil {
		return nil, err
	}
	b.subnetID = sn.ID
	b.osCfg = openstack.Config{Endpoint: endpoint, SubnetID: sn.ID}
	b.osCfg.Defaults()
	p := netip.MustParsePrefix(cidr).Masked().Addr().As4()
	b.tb = testbed.New(prefix, netip.PrefixFrom(netip.AddrFrom4(p), 24))
	if err := b.newPort(ctx, b.tb.NodeIP); err != nil {
		return nil, err
	}
	if err := b.tb.Up(); err != nil {
		return nil, err
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	if b.fwd, err = testbed.Forward(b.tb.NodeNS(), "127.0.0.1:19696", u.Host); err != nil {
		return nil, err
	}
	return b, nil
}

// newPort makes a VM port with ip on the bed's subnet.
func (b *neutronBed) newPort(ctx context.Context, ip netip.Addr) error {
	_, err := ports.Create(ctx, b.nc, ports.CreateOpts{NetworkID: b.netID, DeviceOwner: "compute:vpcni-bench",
		FixedIPs: []ports.IP{{SubnetID: b.subnetID, IPAddress: ip.String()}}}).Extract()
	return err
}

// agent starts vpcnid on the node with the openstack provider and the
// given pool policy, state in a fresh directory.
func (b *neutronBed) agent(name string, pool config.Pool, maxAddresses int) (*testbed.Agent, *testbed.CNI, error) {
	dir := filepath.Join(b.tb.RunDir, name)
	cfg := b.tb.AgentConfig(dir, b.tb.Subnet.String())
	os := b.osCfg
	os.Endpoint = "http://127.0.0.1:19696/"
	os.MaxAddresses = maxAddresses
	cfg.Provider = config.Provider{Type: "openstack", Settings: &os}
	cfg.Pool = pool
	a, err := b.tb.StartAgent(b.bin, cfg)
	if err != nil {
		return nil, nil, err
	}
	cni, err := b.tb.NewCNI([]string{b.bin}, filepath.Join(dir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-"+name, cfg.SocketPath))
	return a, cni, err
}

// calls sums the agent's Neutron HTTP requests.
func calls(a *testbed.Agent) int64 {
	st, err := a.State()
	if err != nil {
		return -1
	}
	var sum int64
	for _, v := range st.Pool.ProviderCalls {
		sum += v
	}
	return sum
}

func (b *neutronBed) close() error {
	var errs []error
	if b.fwd != nil {
		b.fwd.Close()
	}
	if b.tb != nil {
		errs = append(errs, b.tb.Down())
	}
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if pages, err := ports.List(b.nc, ports.ListOpts{NetworkID: b.netID}).AllPages(c); err == nil {
		all, _ := ports.ExtractPorts(pages)
		for _, p := range all {
			_ = ports.Delete(c, b.nc, p.ID).ExtractErr()
		}
	}
	errs = append(errs, networks.Delete(c, b.nc, b.netID).ExtractErr())
	return errors.Join(errs...)
}

// vmProvider makes a VM port with ip and the openstack provider on it,
// with no agent: the benchmarks' yardstick for direct Neutron updates.
func (b *neutronBed) vmProvider(ctx context.Context, ip netip.Addr) (*openstack.Provider, error) {
	if err := b.newPort(ctx, ip); err != nil {
		return nil, err
	}
	return openstack.New(ctx, b.osCfg, ip)
}
