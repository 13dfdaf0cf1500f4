// Package labnics proves the provider side of passthrough and secondary
// NICs on the lab: NICs attached through the lab's os-interface stand-in
// appear in the node as a hypervisor hot-plugs them (found by MAC, down,
// no addresses), carry traffic across the VPC bridge, and port security
// lets an address out only by the port that holds it. The datapath's part
// (moving the NIC into a pod, the route table per NIC) is done here by
// hand with ip(8), as the datapath modes will.
package labnics

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the lab NIC tests")
	os.Exit(m.Run())
}

func up(t *testing.T, subnet string) *lab.Lab {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnin%d", os.Getpid()%100000), Nodes: 1, Subnet: netip.MustParsePrefix(subnet)})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func newProvider(t *testing.T, l *lab.Lab, cfg openstack.Config) *openstack.Provider {
	cfg.Endpoint, cfg.ComputeEndpoint, cfg.SubnetID = l.URL, l.ComputeURL, l.SubnetID
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := openstack.New(context.Background(), cfg, l.Nodes[0].IP)
	if err != nil {
		t.Fatalf("provider: %v", err)
	}
	return p
}

// link is one interface as ip -j shows it.
type link struct {
	Name     string   `json:"ifname"`
	MAC      string   `json:"address"`
	Flags    []string `json:"flags"`
	AddrInfo []any    `json:"addr_info"`
}

func links(t *testing.T, ns string) []link {
	out, err := netnsutil.Output(ns, "ip", "-j", "addr", "show")
	if err != nil {
		t.Fatalf("ip addr in %s: %v: %s", ns, err, out)
	}
	var ls []link
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatal(err)
	}
	return ls
}

// nicByMAC finds the NIC of a lease in a namespace, as the datapath does.
func nicByMAC(t *testing.T, ns string, l alloc.Lease) (link, bool) {
	for _, k := range links(t, ns) {
		if strings.EqualFold(k.MAC, l.NIC.MAC) {
			return k, true
		}
	}
	return link{}, false
}

func run(t *testing.T, ns string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if err := netnsutil.Exec(ns, strings.Fields(c)...); err != nil {
			t.Fatal(err)
		}
	}
}

func probe(from string, src, dst netip.Addr) error {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return netnsutil.ProbeFrom(c, netnsutil.Path(from), src, dst.String()+":7007")
}

// TestPassthroughNIC: a passthrough lease's NIC is hot-plugged into the
// node down and bare; moved into a pod with the lease's address and
// gateway it reaches the legacy VM and back; Release unplugs it from the
// pod and deletes its port.
func TestPassthroughNIC(t *testing.T) {
	l := up(t, "10.91.0.0/24")
	echo, err := netnsutil.ServeEcho(netnsutil.Path(l.Legacy.NS), l.Legacy.IP.String()+":7007")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	p := newProvider(t, l, openstack.Config{Mode: "passthrough"})
	leases, err := p.Assign(context.Background(), provider.AssignRequest{Count: 1})
	if err != nil || len(leases) != 1 || leases[0].NIC == nil {
		t.Fatalf("Assign = %+v, %v", leases, err)
	}
	le := leases[0]
	nic, ok := nicByMAC(t, l.Nodes[0].NS, le)
	if !ok {
		t.Fatalf("no link with MAC %s in node %s: %+v", le.NIC.MAC, l.Nodes[0].NS, links(t, l.Nodes[0].NS))
	}
	if strings.Contains(strings.Join(nic.Flags, ","), "UP") || len(nic.AddrInfo) != 0 {
		t.Fatalf("the hot-plugged NIC %+v should be down and without addresses", nic)
	}
	pod := l.Prefix + "-pod"
	if err := netnsutil.Add(pod); err != nil {
		t.Fatal(err)
	}
	run(t, l.Nodes[0].NS, "ip link set "+nic.Name+" netns "+pod)
	run(t, pod, "ip link set lo up", "ip link set "+nic.Name+" name eth0",
		fmt.Sprintf("ip addr add %s/%d dev eth0", le.Address, le.Prefix.Bits()), "ip link set eth0 up",
		"ip route add default via "+le.Gateway.String())
	if err := probe(pod, le.Address, l.Legacy.IP); err != nil {
		t.Fatalf("pod %s on its passthrough NIC → legacy VM: %v", le.Address, err)
	}
	if err := p.Release(context.Background(), []netip.Addr{le.Address}); err != nil {
		t.Fatal(err)
	}
	if _, still := nicByMAC(t, pod, le); still {
		t.Fatalf("the NIC is still in the pod after Release")
	}
	if _, found := l.API.Port(le.Interface); found {
		t.Fatalf("port %s still exists after Release", le.Interface)
	}
}

// TestSecondaryNICPortSecurity: past maxAddresses a pod address goes on a
// secondary NIC; routed out of that NIC by its own table and a from-rule
// (seed 002), it reaches the legacy VM; sent out of the primary NIC the
// lab's port security drops it — the address is allowed only on the port
// that holds it.
func TestSecondaryNICPortSecurity(t *testing.T) {
	l := up(t, "10.92.0.0/24")
	echo, err := netnsutil.ServeEcho(netnsutil.Path(l.Legacy.NS), l.Legacy.IP.String()+":7007")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	p := newProvider(t, l, openstack.Config{MaxAddresses: 1, SecondaryNICs: 1})
	leases, err := p.Assign(context.Background(), provider.AssignRequest{Count: 2})
	if err != nil || len(leases) != 2 {
		t.Fatalf("Assign(2) = %+v, %v", leases, err)
	}
	var second alloc.Lease
	for _, le := range leases {
		if le.NIC != nil {
			second = le
		}
	}
	if second.NIC == nil {
		t.Fatalf("no lease on a secondary NIC: %+v", leases)
	}
	ns := l.Nodes[0].NS
	nic, ok := nicByMAC(t, ns, second)
	if !ok {
		t.Fatalf("no secondary NIC with MAC %s in the node", second.NIC.MAC)
	}
	run(t, ns, "ip link set "+nic.Name+" up",
		"ip addr add "+second.NIC.Address.String()+"/32 dev "+nic.Name,
		"ip addr add "+second.Address.String()+"/32 dev "+nic.Name,
		fmt.Sprintf("ip route add %s dev %s table 101", second.Prefix, nic.Name),
		fmt.Sprintf("ip route add default via %s dev %s table 101", second.Gateway, nic.Name))
	// Out of the primary NIC (main table): dropped by port security.
	if err := probe(ns, second.Address, l.Legacy.IP); err == nil {
		t.Fatalf("%s left by the primary NIC and got through: port security should drop it", second.Address)
	}
	// The control: allowed on the primary port too, the same path works —
	// the drop was port security's.
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 10 * time.Second})
	setPairs := func(pairs []ports.AddressPair) {
		if _, err := ports.Update(context.Background(), nc, l.Nodes[0].PortID, ports.UpdateOpts{AllowedAddressPairs: &pairs}).Extract(); err != nil {
			t.Fatal(err)
		}
	}
	setPairs([]ports.AddressPair{{IPAddress: second.Address.String()}})
	run(t, ns, "ip neigh flush dev eth0")
	if err := probe(ns, second.Address, l.Legacy.IP); err != nil {
		t.Fatalf("control: with %s allowed on the primary port too, by the primary NIC: %v", second.Address, err)
	}
	setPairs([]ports.AddressPair{})
	run(t, ns, "ip neigh flush dev eth0")
	run(t, l.Legacy.NS, "ip neigh flush dev eth0")
	run(t, ns, "ip rule add from "+second.Address.String()+" lookup 101 pref 1536")
	if err := probe(ns, second.Address, l.Legacy.IP); err != nil {
		t.Fatalf("%s by its secondary NIC → legacy VM: %v", second.Address, err)
	}
	if err := p.Release(context.Background(), provider.Addresses(leases)); err != nil {
		t.Fatal(err)
	}
	if _, still := nicByMAC(t, ns, second); still {
		t.Fatalf("the emptied secondary NIC is still in the node")
	}
}
