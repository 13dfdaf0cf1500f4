package lab

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// probe6 is one TCP round trip from namespace ns (from source src, if
// valid) to the echo server on dst, given two seconds.
func probe6(ns string, src, dst netip.Addr) error {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return netnsutil.ProbeFrom(c, netnsutil.Path(ns), src, testbed.HostPort(dst, 7777))
}

// The lab's IPv6 segment: VMs reach each other by their IPv6 fixed IPs, a
// source address the port does not hold is dropped, and one inside an
// IPv6 allowed address pair (a /96, as a node's prefix pair) passes once
// the pair is on the port — Neutron's port security, for IPv6.
func TestLabIPv6PortSecurity(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcni6f%d", os.Getpid()%100000), Nodes: 1,
		Subnet: netip.MustParsePrefix("10.96.6.0/24"), Subnet6: netip.MustParsePrefix("fd00:96:6::/64")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	node, legacy := l.Nodes[0], l.Legacy
	if !node.IP6.IsValid() || !legacy.IP6.IsValid() || l.SubnetID6 == "" {
		t.Fatalf("lab hosts without IPv6: node %v legacy %v subnet %q", node.IP6, legacy.IP6, l.SubnetID6)
	}
	for _, h := range []lab.Host{node, legacy, l.Router} {
		srv, err := netnsutil.ServeEcho(netnsutil.Path(h.NS), testbed.HostPort(h.IP6, 7777))
		if err != nil {
			t.Fatalf("echo server on %s: %v", h.Name, err)
		}
		t.Cleanup(func() { srv.Close() })
	}
	if err := probe6(legacy.NS, netip.Addr{}, node.IP6); err != nil {
		t.Fatalf("legacy VM %s -> node %s over IPv6: %v", legacy.IP6, node.IP6, err)
	}
	if err := probe6(node.NS, netip.Addr{}, l.Router.IP6); err != nil {
		t.Fatalf("node -> router %s over IPv6: %v", l.Router.IP6, err)
	}
	spoof := netip.MustParseAddr("fd00:96:6::1:0:5")
	if err := netnsutil.Exec(node.NS, "ip", "-6", "addr", "add", spoof.String()+"/128", "dev", "eth0", "nodad"); err != nil {
		t.Fatal(err)
	}
	if err := probe6(node.NS, spoof, legacy.IP6); err == nil {
		t.Fatalf("a source the node's port does not hold (%s) passed port security", spoof)
	}
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	pairs := []ports.AddressPair{{IPAddress: "fd00:96:6::1:0:0/96"}}
	if _, err := ports.Update(c, nc, node.PortID, ports.UpdateOpts{AllowedAddressPairs: &pairs}).Extract(); err != nil {
		t.Fatalf("add the /96 pair: %v", err)
	}
	start := time.Now()
	for {
		err := probe6(node.NS, spoof, legacy.IP6)
		if err == nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%s inside the port's /96 pair still dropped after 10s: %v", spoof, err)
		}
	}
	t.Logf("vpcni-test: lab IPv6: legacy VM <-> node by fixed IPs; %s dropped until a /96 pair held it, then passed within %s", spoof, time.Since(start).Round(time.Millisecond))
	if err := l.FabricErr(); err != nil {
		t.Fatal(err)
	}
}
