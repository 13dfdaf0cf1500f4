package openstack

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
)

// A NIC port's description is the cloud's to change: a mark cut short or
// garbled reads as no mark (the port's first address), never a crash.
func TestNICPortOwnMark(t *testing.T) {
	p := &Provider{cfg: Config{SubnetID: "sn"}}
	fixed := []ports.IP{{SubnetID: "sn", IPAddress: "10.0.0.9"}, {SubnetID: "sn", IPAddress: "10.0.0.30"}}
	for desc, want := range map[string]string{
		"[" + nicOwnMark + "10.0.0.30]": "10.0.0.30",
		"x " + nicOwnMark:               "10.0.0.9",
		"[" + nicOwnMark + "garbage]":   "10.0.0.9",
		"no mark at all":                "10.0.0.9",
	} {
		got := p.nicPortOf(ports.Port{Description: desc, FixedIPs: fixed}).own
		if got != netip.MustParseAddr(want) {
			t.Errorf("description %q: own address %v, want %s", desc, got, want)
		}
	}
}

// A secondary NIC's port is on the subnet of its own address, which may
// not be the pods' subnet (subnets, subnetTags); its addresses are those
// on that subnet only.
func TestNICPortSubnet(t *testing.T) {
	p := &Provider{cfg: Config{SubnetID: "sn"}}
	for _, c := range []struct {
		desc       string
		fixed      []ports.IP
		subnet     string
		own, addrs string
	}{
		{"[" + nicOwnMark + "10.1.0.5]", []ports.IP{{SubnetID: "b", IPAddress: "10.1.0.5"}, {SubnetID: "b", IPAddress: "10.1.0.6"}},
			"b", "10.1.0.5", "[10.1.0.5 10.1.0.6]"},
		// No mark: the pods' subnet's first address, else the first.
		{"", []ports.IP{{SubnetID: "b", IPAddress: "10.1.0.7"}, {SubnetID: "sn", IPAddress: "10.0.0.8"}}, "sn", "10.0.0.8", "[10.0.0.8]"},
		{"", []ports.IP{{SubnetID: "c", IPAddress: "10.2.0.9"}}, "c", "10.2.0.9", "[10.2.0.9]"},
		// No mark and an IPv6 (SLAAC) address sorted first: the IPv4 one's.
		{"", []ports.IP{{SubnetID: "s6", IPAddress: "fd00::f816:3eff:fe00:1"}, {SubnetID: "c", IPAddress: "10.2.0.9"}}, "c", "10.2.0.9", "[10.2.0.9]"},
		{"", nil, "", "invalid IP", "[]"},
	} {
		n := p.nicPortOf(ports.Port{Description: c.desc, FixedIPs: c.fixed})
		if n.subnet != c.subnet || n.own.String() != c.own || fmt.Sprint(n.addrs) != c.addrs {
			t.Errorf("%q %v: subnet %q own %s addrs %v; want %q %s %s", c.desc, c.fixed, n.subnet, n.own, n.addrs, c.subnet, c.own, c.addrs)
		}
	}
}
