package openstack

import (
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
