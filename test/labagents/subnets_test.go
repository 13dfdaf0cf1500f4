package labagents

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// The subnets of TestSubnetFullMovesOn's NICs, on a network of their own
// on the router: A has 3 free addresses (a NIC's own and two pods'), B 2.
const (
	fullACIDR = "10.91.4.0/29"
	fullBCIDR = "10.91.5.0/29"
)

// TestSubnetFullMovesOn: a node's secondary NICs go on the listed subnets,
// the one with most free addresses first, and a full one moves on to the
// next instead of stopping the node — on the real Neutron, with the real
// linuxbridge and L3 agents wiring each NIC the lab's hypervisor attaches.
// The VM port holds maxAddresses (4) pods; the next two go on a NIC in A
// (3 free, more than B's 2), which fills A; the next on a NIC in B. Each
// NIC's pod leaves by its own port, through the router, to the legacy VM.
func TestSubnetFullMovesOn(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	nc, w, vms := upWorld(t, c, map[string]netip.Addr{"n1": at(211), "legacy": at(230)})
	n1, legacy := vms["n1"], vms["legacy"]
	serve(t, netnsutil.Path(legacy.ns), legacy.ip)

	nicNet, err := networks.Create(c, nc, networks.CreateOpts{Name: prefix + "-nics"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range []struct {
		cidr string
		free int
	}{{fullACIDR, 3}, {fullBCIDR, 2}} {
		p := netip.MustParsePrefix(s.cidr)
		gw, dhcp := p.Addr().Next(), false
		first, last := gw.Next(), gw
		for range s.free {
			last = last.Next()
		}
		gws := gw.String()
		sn, err := subnets.Create(c, nc, subnets.CreateOpts{Name: prefix + "-nics", NetworkID: nicNet.ID, IPVersion: gophercloud.IPv4,
			CIDR: s.cidr, GatewayIP: &gws, EnableDHCP: &dhcp,
			AllocationPools: []subnets.AllocationPool{{Start: first.String(), End: last.String()}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := routers.AddInterface(c, nc, w.routerID, routers.AddInterfaceOpts{SubnetID: sn.ID}).Extract(); err != nil {
			t.Fatalf("router interface on %s: %v", s.cidr, err)
		}
		ids = append(ids, sn.ID)
	}

	hv, err := startHypervisor(w, n1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hv.Close() })
	runDir := t.TempDir()
	for _, addr := range []string{neutronAddr, hv.l.Addr().String()} {
		fw, err := testbed.Forward(n1.ns, addr, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fw.Close() })
	}
	cfg := nodeConfig(runDir, n1, n1.ns)
	// No subnetID: the VM port serves from its own subnet, the NICs from
	// the listed ones (none of them on the VM port's network).
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: endpoint, Subnets: ids,
		ComputeEndpoint: hv.URL(), MaxNICs: 3, SecondaryNICs: 2, MaxAddresses: 4}}
	agent, cni := startNode(t, runDir, n1, cfg)

	type pod struct {
		ns string
		ip netip.Addr
	}
	var pods []pod
	for i := range 7 {
		ns := fmt.Sprintf("%s-pod-full%d", prefix, i)
		if err := netnsutil.Add(ns); err != nil {
			t.Fatal(err)
		}
		res, err := cni.Add(c, testbed.Runtime(fmt.Sprintf("full-%d", i), netnsutil.Path(ns), "eth0", nil))
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
		r, err := types100.GetResult(res)
		if err != nil {
			t.Fatal(err)
		}
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		pods = append(pods, pod{ns: netnsutil.Path(ns), ip: ip})
	}
	inA, inB, inVM := netip.MustParsePrefix(fullACIDR), netip.MustParsePrefix(fullBCIDR), netip.MustParsePrefix(subnetCIDR)
	where := func(ip netip.Addr) string {
		switch {
		case inVM.Contains(ip):
			return "VM"
		case inA.Contains(ip):
			return "A"
		case inB.Contains(ip):
			return "B"
		}
		return "?"
	}
	var got []string
	for _, p := range pods {
		got = append(got, where(p.ip))
	}
	if want := []string{"VM", "VM", "VM", "VM", "A", "A", "B"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the 7 pods' subnets %v (%v), want %v: 4 on the VM port, 2 on a NIC in A (3 free: the NIC's and two), then A full and one on a NIC in B", got, pods, want)
	}
	st, err := agent.State()
	if err != nil {
		t.Fatal(err)
	}
	nics := map[string]string{}
	for _, a := range st.Allocations {
		if a.NIC != nil {
			nics[where(a.Address)] = a.Interface
		}
	}
	if len(nics) != 2 || nics["A"] == nics["B"] {
		t.Fatalf("NIC ports by subnet %v: want one NIC in A and another in B", nics)
	}
	// Each NIC's pod leaves by its own port (whose fixed IPs the agent's
	// anti-spoofing admits) and reaches the legacy VM through the router.
	for _, i := range []int{4, 6} {
		if d, err := eventually(30*time.Second, func() error { return probe(c, pods[i].ns, netip.Addr{}, legacy.ip) }); err != nil {
			t.Errorf("pod %s (subnet %s) -> legacy VM %s: %v", pods[i].ip, where(pods[i].ip), legacy.ip, err)
		} else {
			t.Logf("vpcni-test: pod %s on the NIC in subnet %s -> legacy VM through the router: answered %.1fs after the last ADD", pods[i].ip, where(pods[i].ip), d.Seconds())
		}
	}
	t.Logf("vpcni-test: subnets %s (3 free) and %s (2 free) listed: pods %v on [VM port ×4, NIC %s in A ×2, NIC %s in B]: A chosen first (most free), full after the NIC and 2 pods, the next NIC on B", fullACIDR, fullBCIDR, got, nics["A"], nics["B"])
}
