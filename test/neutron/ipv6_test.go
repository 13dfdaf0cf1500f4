package neutron

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
)

// TestNeutronIPv6Facts holds the real neutron-server to what vpcni's IPv6
// support builds on (docs/openstack.md, "IPv6"): each subtest asserts one
// behaviour, so a Neutron that changes it fails here first, and logs the
// figure it measured.
func TestNeutronIPv6Facts(t *testing.T) {
	t.Parallel() // own networks and addresses, as the other IPv6 tests
	ep := realNeutron{}.ep()
	// v6net makes a network with one IPv6 subnet of the given modes: the
	// gateway ::1, an allocation pool ::2-::ff.
	v6net := func(t *testing.T, cidr, addrMode, raMode string) (netID, subnetID string) {
		t.Helper()
		netID = newNetwork(t, ep)
		return netID, v6subnet(t, netID, cidr, addrMode, raMode)
	}

	// (a) Which ipv6_address_mode / ipv6_ra_mode take several explicit
	// v6 fixed IPs on one port. Neutron calls a subnet "auto address"
	// when either mode is slaac or dhcpv6-stateless, and refuses any
	// explicit address on it.
	t.Run("ExplicitFixedIPsByMode", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			addrMode, raMode string
			auto             bool
		}{
			{"", "", false},
			{"dhcpv6-stateful", "", false},
			{"dhcpv6-stateful", "dhcpv6-stateful", false},
			{"slaac", "slaac", true},
			{"slaac", "", true},
			{"dhcpv6-stateless", "dhcpv6-stateless", true},
			{"", "slaac", true},
			{"", "dhcpv6-stateless", true},
		}
		netID := newNetwork(t, ep)
		for i, c := range cases {
			t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
				t.Parallel()
				cidr := fmt.Sprintf("fd00:6a:%x::/64", i)
				snID := v6subnet(t, netID, cidr, c.addrMode, c.raMode)
				base := netip.MustParsePrefix(cidr).Addr()
				var fixed []ports.IP
				for _, o := range []int{5, 6, 7} {
					fixed = append(fixed, ports.IP{SubnetID: snID, IPAddress: addrPlus(base, o).String()})
				}
				p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID, FixedIPs: fixed}).Extract()
				what := fmt.Sprintf("ipv6_address_mode=%q ipv6_ra_mode=%q", c.addrMode, c.raMode)
				switch {
				case c.auto && err == nil:
					t.Errorf("%s: a port with 3 explicit v6 fixed IPs was accepted (%v); vpcni refuses such subnets for fixed-ips on the contrary fact", what, p.FixedIPs)
				case c.auto:
					typ, status := neutronError(err)
					if status != http.StatusBadRequest || typ != "AllocationOnAutoAddressSubnet" {
						t.Errorf("%s: explicit v6 fixed IPs refused with %d %s (%v), want 400 AllocationOnAutoAddressSubnet", what, status, typ, err)
					}
					t.Logf("vpcni-fact: %s: 3 explicit v6 fixed IPs refused: %d %s", what, status, typ)
				case err != nil:
					t.Errorf("%s: 3 explicit v6 fixed IPs refused: %v", what, err)
				default:
					// Only its own subnet's: the SLAAC subnets the other
					// cases add to the shared network meanwhile give the
					// port an EUI-64 address each (SLAACAddressKept).
					own := slices.DeleteFunc(slices.Clone(p.FixedIPs), func(f ports.IP) bool { return f.SubnetID != snID })
					if len(own) != 3 {
						t.Errorf("%s: port has fixed IPs %v on the subnet, want the 3 asked for", what, own)
					}
					t.Logf("vpcni-fact: %s: a port holds 3 explicit v6 fixed IPs %v", what, ipsOf(own))
				}
			})
		}
	})

	// (b) On a network with a SLAAC subnet every port gets its EUI-64
	// address (from its MAC) without asking, and a fixed_ips PUT that
	// leaves it out keeps it: vpcni's read-back must not take it for an
	// address it added or lost.
	t.Run("SLAACAddressKept", func(t *testing.T) {
		t.Parallel()
		netID := newNetwork(t, ep)
		v4 := ep.AddSubnet(t, netID, "10.206.1.0/24", 50)
		v6 := v6subnet(t, netID, "fd00:6b::/64", "slaac", "slaac")
		p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID,
			FixedIPs: []ports.IP{{SubnetID: v4.ID, IPAddress: "10.206.1.10"}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		eui := eui64(t, netip.MustParsePrefix("fd00:6b::/64"), p.MACAddress)
		if !slices.Contains(ipsOf(p.FixedIPs), eui) {
			t.Fatalf("port with MAC %s asked for v4 only has %v, want its EUI-64 address %s added", p.MACAddress, ipsOf(p.FixedIPs), eui)
		}
		t.Logf("vpcni-fact: a port asked for v4 alone on a network with a SLAAC subnet got %v (EUI-64 of %s)", ipsOf(p.FixedIPs), p.MACAddress)
		rev := p.RevisionNumber
		fixed := []ports.IP{{SubnetID: v4.ID, IPAddress: "10.206.1.10"}, {SubnetID: v4.ID, IPAddress: "10.206.1.11"}}
		after, err := ports.Update(ctx(t), nc, p.ID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		got := ipsOf(after.FixedIPs)
		if !slices.Contains(got, eui) || !slices.Contains(got, netip.MustParseAddr("10.206.1.11")) || len(got) != 3 {
			t.Fatalf("after a PUT of two v4 fixed IPs the port has %v, want those and the kept %s", got, eui)
		}
		t.Logf("vpcni-fact: a fixed_ips PUT leaving out the SLAAC address keeps it: %v", got)
		// An explicit address on it, even alongside, is refused.
		fixed = append(fixed, ports.IP{SubnetID: v6, IPAddress: "fd00:6b::99"})
		rev = after.RevisionNumber
		_, err = ports.Update(ctx(t), nc, p.ID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if typ, status := neutronError(err); status != http.StatusBadRequest || typ != "AllocationOnAutoAddressSubnet" {
			t.Fatalf("an explicit address on the SLAAC subnet in a PUT: %v, want 400 AllocationOnAutoAddressSubnet", err)
		}
	})

	// (c) A v6 CIDR as an allowed address pair is accepted and counts in
	// max_allowed_address_pair (10) with v4 pairs.
	t.Run("PairPrefixQuota", func(t *testing.T) {
		t.Parallel()
		netID, snID := v6net(t, "fd00:6c::/64", "", "")
		var pairs []ports.AddressPair
		for i := range 5 {
			pairs = append(pairs, ports.AddressPair{IPAddress: fmt.Sprintf("fd00:6c:0:0:%x::/96", i+1)},
				ports.AddressPair{IPAddress: fmt.Sprintf("10.206.3.%d", i+1)})
		}
		p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID,
			FixedIPs: []ports.IP{{SubnetID: snID, IPAddress: "fd00:6c::10"}}, AllowedAddressPairs: pairs}).Extract()
		if err != nil {
			t.Fatalf("10 pairs (5 v6 /96, 5 v4): %v", err)
		}
		var back []string
		for _, ap := range p.AllowedAddressPairs {
			back = append(back, ap.IPAddress)
		}
		if len(back) != 10 || !slices.Contains(back, "fd00:6c:0:0:1::/96") {
			t.Fatalf("pairs read back %v, want the 10 written, fd00:6c:0:0:1::/96 among them", back)
		}
		more := append(slices.Clone(pairs), ports.AddressPair{IPAddress: "fd00:6c:0:0:6::/96"})
		rev := p.RevisionNumber
		_, err = ports.Update(ctx(t), nc, p.ID, ports.UpdateOpts{AllowedAddressPairs: &more, RevisionNumber: &rev}).Extract()
		typ, status := neutronError(err)
		if status != http.StatusBadRequest || typ != "AllowedAddressPairExhausted" {
			t.Fatalf("an 11th pair (v6 /96) after 10: %v, want 400 AllowedAddressPairExhausted", err)
		}
		t.Logf("vpcni-fact: 5 v6 /96 + 5 v4 pairs accepted; an 11th refused: %d %s", status, typ)
	})

	// (d) A pair's range is not reserved: Neutron hands an address inside
	// it to a new port when the allocation pool reaches into it.
	t.Run("PairNotReserved", func(t *testing.T) {
		t.Parallel()
		netID, snID := v6net(t, "fd00:6d::/64", "", "")
		pair := []ports.AddressPair{{IPAddress: "fd00:6d::/96"}}
		if _, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID,
			FixedIPs: []ports.IP{{SubnetID: snID, IPAddress: "fd00:6d::1:0:0:10"}}, AllowedAddressPairs: pair}).Extract(); err != nil {
			t.Fatal(err)
		}
		inside := netip.MustParsePrefix("fd00:6d::/96")
		other, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID, FixedIPs: []ports.IP{{SubnetID: snID}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		got := ipsOf(other.FixedIPs)
		if len(got) != 1 || !inside.Contains(got[0]) {
			t.Fatalf("a new port got %v, want one address inside the other port's pair %s (the pool is inside it)", got, inside)
		}
		named, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID, FixedIPs: []ports.IP{{SubnetID: snID, IPAddress: "fd00:6d::77"}}}).Extract()
		if err != nil {
			t.Fatalf("an address named inside another port's pair: %v", err)
		}
		t.Logf("vpcni-fact: with a pair %s on one port, Neutron gave a new port %v and a named %v: pairs reserve nothing", inside, got, ipsOf(named.FixedIPs))
	})

	// (e) A v6 subnet as a router interface, and v6 extra routes through
	// a next hop on it (add_extraroutes), beside v4 ones in one call.
	t.Run("RouterV6Routes", func(t *testing.T) {
		t.Parallel()
		netID := newNetwork(t, ep)
		v4 := ep.AddSubnet(t, netID, "10.206.5.0/24", 50)
		v6 := v6subnet(t, netID, "fd00:6e::/64", "", "")
		r, err := routers.Create(ctx(t), nc, routers.CreateOpts{Name: fmt.Sprintf("vpcni-test-%d-v6", os.Getpid())}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c := ctx(t)
			for _, sn := range []string{v4.ID, v6} {
				_, _ = routers.RemoveInterface(c, nc, r.ID, routers.RemoveInterfaceOpts{SubnetID: sn}).Extract()
			}
			_ = routers.Delete(c, nc, r.ID).ExtractErr()
		})
		for _, sn := range []string{v4.ID, v6} {
			if _, err := routers.AddInterface(ctx(t), nc, r.ID, routers.AddInterfaceOpts{SubnetID: sn}).Extract(); err != nil {
				t.Fatalf("router interface on subnet %s: %v", sn, err)
			}
		}
		routes := []routers.Route{
			{DestinationCIDR: "fd00:6e:1::/96", NextHop: "fd00:6e::10"},
			{DestinationCIDR: "fd00:6e:1:0:1::/96", NextHop: "fd00:6e::11"},
			{DestinationCIDR: "10.206.6.0/26", NextHop: "10.206.5.10"},
		}
		got, err := extraroutes.Add(ctx(t), nc, r.ID, extraroutes.Opts{Routes: &routes}).Extract()
		if err != nil {
			t.Fatalf("add_extraroutes with v6 and v4 routes: %v", err)
		}
		if len(got.Routes) != 3 {
			t.Fatalf("router routes %v, want the 3 added", got.Routes)
		}
		// Neutron checks only that a next hop lies on a router subnet, not
		// that its family is the destination's: a v6 destination through
		// a v4 next hop is accepted, so vpcni pairs the families itself.
		mixed := []routers.Route{{DestinationCIDR: "fd00:6e:3::/96", NextHop: "10.206.5.12"}}
		if got, err = extraroutes.Add(ctx(t), nc, r.ID, extraroutes.Opts{Routes: &mixed}).Extract(); err != nil || len(got.Routes) != 4 {
			t.Fatalf("a v6 route through a v4 next hop: %v (routes %v); Neutron accepted it when this test was written", err, got)
		}
		// A call with one next hop on no router subnet is refused whole.
		bad := []routers.Route{{DestinationCIDR: "fd00:6e:2::/96", NextHop: "fd00:6e::12"}, {DestinationCIDR: "fd00:6e:4::/96", NextHop: "fd00:99::1"}}
		_, err = extraroutes.Add(ctx(t), nc, r.ID, extraroutes.Opts{Routes: &bad}).Extract()
		typ, status := neutronError(err)
		after, gerr := routers.Get(ctx(t), nc, r.ID).Extract()
		if status != http.StatusBadRequest || gerr != nil || len(after.Routes) != 4 {
			t.Fatalf("a v6 route through a next hop on no router subnet: %v; router then has %v (%v), want 400 and the 4 routes alone", err, after, gerr)
		}
		t.Logf("vpcni-fact: v6 router interface and v6 extra routes accepted; a v6 destination via a v4 next hop accepted too; a call with a next hop off the router's subnets refused whole: %d %s", status, typ)
	})

	// (f) The reverse lookup by a v6 fixed IP, ':' sent as %3A (as
	// gophercloud encodes it) and sent bare.
	t.Run("ReverseLookup", func(t *testing.T) {
		t.Parallel()
		netID, snID := v6net(t, "fd00:6f::/64", "", "")
		p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID,
			FixedIPs: []ports.IP{{SubnetID: snID, IPAddress: "fd00:6f::5"}, {SubnetID: snID, IPAddress: "fd00:6f::6"}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		pages, err := ports.List(nc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: "fd00:6f::6"}}}).AllPages(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		found, _ := ports.ExtractPorts(pages)
		if len(found) != 1 || found[0].ID != p.ID {
			t.Fatalf("lookup by fixed IP fd00:6f::6 found %d ports, want port %s alone", len(found), p.ID)
		}
		for _, q := range []string{"fixed_ips=ip_address%3Dfd00%3A6f%3A%3A6", "fixed_ips=ip_address=fd00:6f::6"} {
			var body struct{ Ports []ports.Port }
			if _, err := nc.Get(ctx(t), nc.ServiceURL("ports")+"?"+q, &body, nil); err != nil {
				t.Fatalf("GET ports?%s: %v", q, err)
			}
			if len(body.Ports) != 1 || body.Ports[0].ID != p.ID {
				t.Fatalf("GET ports?%s found %d ports, want port %s alone", q, len(body.Ports), p.ID)
			}
		}
		// The lookup takes the address as written: a longer spelling of
		// the same address finds nothing, so vpcni sends the canonical
		// form (netip.Addr.String), as Neutron stores it.
		var body struct{ Ports []ports.Port }
		if _, err := nc.Get(ctx(t), nc.ServiceURL("ports")+"?fixed_ips=ip_address%3D"+url.QueryEscape("fd00:6f:0:0:0:0:0:6"), &body, nil); err != nil {
			t.Fatal(err)
		}
		if len(body.Ports) != 0 {
			t.Fatalf("the uncompressed spelling found %d ports: Neutron now normalises the filter (the canonical form still works)", len(body.Ports))
		}
		t.Logf("vpcni-fact: reverse lookup by v6 fixed IP works with ':' encoded and bare; the uncompressed spelling finds %d ports", len(body.Ports))
	})

	// (g) One If-Match PUT carrying new v4 and v6 fixed IPs at once, and
	// what it costs beside one PUT per family.
	t.Run("DualStackPUT", func(t *testing.T) {
		t.Parallel()
		netID := newNetwork(t, ep)
		v4 := ep.AddSubnet(t, netID, "10.206.7.0/24", 100)
		v6 := v6subnet(t, netID, "fd00:67::/64", "", "")
		p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID,
			FixedIPs: []ports.IP{{SubnetID: v4.ID, IPAddress: "10.206.7.10"}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if len(p.FixedIPs) != 1 {
			t.Fatalf("a port asked for one v4 address on a network with a stateful v6 subnet got %v: Neutron adds v6 addresses only from auto-address subnets", p.FixedIPs)
		}
		put := func(add []ports.IP) time.Duration {
			t.Helper()
			cur, err := ports.Get(ctx(t), nc, p.ID).Extract()
			if err != nil {
				t.Fatal(err)
			}
			fixed := append(slices.Clone(cur.FixedIPs), add...)
			rev := cur.RevisionNumber
			start := time.Now()
			after, err := ports.Update(ctx(t), nc, p.ID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
			took := time.Since(start)
			if err != nil {
				t.Fatalf("PUT %v: %v", add, err)
			}
			for _, f := range add {
				if !slices.Contains(ipsOf(after.FixedIPs), netip.MustParseAddr(f.IPAddress)) {
					t.Fatalf("after the PUT the port has %v, missing %s", ipsOf(after.FixedIPs), f.IPAddress)
				}
			}
			return took
		}
		var both, four, six []ports.IP
		for i := range 4 {
			both = append(both, ports.IP{SubnetID: v4.ID, IPAddress: fmt.Sprintf("10.206.7.%d", 20+i)}, ports.IP{SubnetID: v6, IPAddress: fmt.Sprintf("fd00:67::%x", 0x20+i)})
			four = append(four, ports.IP{SubnetID: v4.ID, IPAddress: fmt.Sprintf("10.206.7.%d", 30+i)})
			six = append(six, ports.IP{SubnetID: v6, IPAddress: fmt.Sprintf("fd00:67::%x", 0x30+i)})
		}
		one := put(both)
		two := put(four) + put(six)
		t.Logf("vpcni-fact: one If-Match PUT adding 4 v4 + 4 v6 fixed IPs took %s; one PUT per family (4 each) took %s together", one.Round(time.Millisecond), two.Round(time.Millisecond))
		// A stale revision turns the dual-stack PUT back whole.
		cur, _ := ports.Get(ctx(t), nc, p.ID).Extract()
		rev := cur.RevisionNumber - 1
		fixed := append(slices.Clone(cur.FixedIPs), ports.IP{SubnetID: v4.ID, IPAddress: "10.206.7.50"}, ports.IP{SubnetID: v6, IPAddress: "fd00:67::50"})
		_, err = ports.Update(ctx(t), nc, p.ID, ports.UpdateOpts{FixedIPs: fixed, RevisionNumber: &rev}).Extract()
		if !gophercloud.ResponseCodeIs(err, http.StatusPreconditionFailed) {
			t.Fatalf("a dual-stack PUT on a stale revision: %v, want 412", err)
		}
		if now, _ := ports.Get(ctx(t), nc, p.ID).Extract(); len(now.FixedIPs) != len(cur.FixedIPs) {
			t.Fatalf("a refused PUT changed the port: %d fixed IPs, had %d", len(now.FixedIPs), len(cur.FixedIPs))
		}
	})
}

// newNetwork makes a network that goes (with its ports) when the test ends.
func newNetwork(t *testing.T, ep neutrontest.Endpoint) string {
	t.Helper()
	n, err := networks.Create(ctx(t), nc, networks.CreateOpts{Name: fmt.Sprintf("vpcni-test-%d-v6-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))}).Extract()
	if err != nil {
		t.Fatalf("create network: %v", err)
	}
	t.Cleanup(func() { ep.DeleteNetwork(n.ID) })
	return n.ID
}

// v6subnet adds an IPv6 subnet of the given modes to a network: the
// gateway ::1, an allocation pool ::2-::ff.
func v6subnet(t *testing.T, netID, cidr, addrMode, raMode string) string {
	t.Helper()
	base := netip.MustParsePrefix(cidr).Addr()
	gw := addrPlus(base, 1).String()
	sn, err := subnets.Create(ctx(t), nc, subnets.CreateOpts{NetworkID: netID, IPVersion: gophercloud.IPv6, CIDR: cidr,
		GatewayIP: &gw, IPv6AddressMode: addrMode, IPv6RAMode: raMode,
		AllocationPools: []subnets.AllocationPool{{Start: addrPlus(base, 2).String(), End: addrPlus(base, 0xff).String()}}}).Extract()
	if err != nil {
		t.Fatalf("create subnet %s (ipv6_address_mode=%q ipv6_ra_mode=%q): %v", cidr, addrMode, raMode, err)
	}
	return sn.ID
}

func addrPlus(a netip.Addr, n int) netip.Addr {
	for range n {
		a = a.Next()
	}
	return a
}

func ipsOf(fixed []ports.IP) []netip.Addr {
	var out []netip.Addr
	for _, f := range fixed {
		out = append(out, netip.MustParseAddr(f.IPAddress))
	}
	return out
}

// eui64 is the address SLAAC forms in prefix from a MAC (RFC 4291 2.5.1).
func eui64(t *testing.T, prefix netip.Prefix, mac string) netip.Addr {
	t.Helper()
	var m [6]byte
	if _, err := fmt.Sscanf(mac, "%02x:%02x:%02x:%02x:%02x:%02x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]); err != nil {
		t.Fatalf("MAC %q: %v", mac, err)
	}
	b := prefix.Addr().As16()
	copy(b[8:], []byte{m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]})
	return netip.AddrFrom16(b)
}

// neutronError is the type and status of a Neutron error answer.
func neutronError(err error) (typ string, status int) {
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) {
		return "", 0
	}
	var body struct {
		NeutronError struct{ Type string } `json:"NeutronError"`
	}
	_ = json.Unmarshal(code.Body, &body)
	return body.NeutronError.Type, code.Actual
}

// TestIPv6SubnetChoice: with ipFamilies ipv4 and ipv6 and no subnetIDv6,
// the provider takes the subnet of the VM port's IPv6 fixed IP that takes
// named addresses, past the SLAAC one Neutron added to the port, and
// leaves that SLAAC address alone; an auto-address subnet, configured or
// the only one found, is refused at start with what to do.
func TestIPv6SubnetChoice(t *testing.T) {
	t.Parallel()
	ep := realNeutron{}.ep()
	netID := newNetwork(t, ep)
	v4 := ep.AddSubnet(t, netID, "10.206.9.0/24", 100)
	slaac := v6subnet(t, netID, "fd00:69:1::/64", "slaac", "slaac")
	stateful := v6subnet(t, netID, "fd00:69:2::/64", "dhcpv6-stateful", "")
	fams := []family.Family{family.V4, family.V6}
	vm := func(t *testing.T, fixed ...ports.IP) {
		t.Helper()
		p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID, DeviceOwner: "compute:vpcni-test", FixedIPs: fixed}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ports.Delete(ctx(t), nc, p.ID).ExtractErr() })
	}
	cfgOf := func() openstack.Config {
		cfg := openstack.Config{Endpoint: endpoint, SubnetID: v4.ID}
		cfg.Defaults()
		return cfg
	}

	t.Run("DiscoveredPastSLAAC", func(t *testing.T) {
		t.Parallel() // one VM port each, on the shared subnets
		vm(t, ports.IP{SubnetID: v4.ID, IPAddress: "10.206.9.10"}, ports.IP{SubnetID: stateful, IPAddress: "fd00:69:2::a"})
		p, err := openstack.NewFamilies(ctx(t), cfgOf(), netip.MustParseAddr("10.206.9.10"), fams)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Assign(ctx(t), provider.AssignRequest{Count: 2, Family: family.V6})
		if err != nil || len(got) != 2 || !netip.MustParsePrefix("fd00:69:2::/64").Contains(got[0].Address) {
			t.Fatalf("Assign(2, ipv6) = %v, %v; want 2 of the stateful subnet", got, err)
		}
		port, err := ports.Get(ctx(t), nc, p.PortID()).Extract()
		if err != nil {
			t.Fatal(err)
		}
		auto := slices.IndexFunc(port.FixedIPs, func(f ports.IP) bool { return f.SubnetID == slaac })
		if auto < 0 {
			t.Fatalf("the VM port lacks its SLAAC address after vpcni's write: %v", port.FixedIPs)
		}
		held, err := p.Held(ctx(t))
		if err != nil || len(held) != 2 {
			t.Fatalf("Held = %v, %v; want the 2 assigned (not the SLAAC %s)", held, err, port.FixedIPs[auto].IPAddress)
		}
		if err := p.Release(ctx(t), []netip.Addr{got[0].Address, got[1].Address}); err != nil {
			t.Fatal(err)
		}
		port, _ = ports.Get(ctx(t), nc, p.PortID()).Extract()
		if len(port.FixedIPs) != 3 {
			t.Fatalf("after Release the VM port has %v, want the node's v4, v6 and SLAAC addresses", port.FixedIPs)
		}
		t.Logf("vpcni-test: %s", p.Info().Subnet)
	})

	// vpcnictl doctor names the VM port's IPv6 subnets with their modes
	// and which take named fixed IPs; a configured SLAAC subnetIDv6 warns.
	t.Run("Doctor", func(t *testing.T) {
		t.Parallel()
		vm(t, ports.IP{SubnetID: v4.ID, IPAddress: "10.206.9.14"}, ports.IP{SubnetID: stateful, IPAddress: "fd00:69:2::e"})
		node := provider.DoctorNode{IP: netip.MustParseAddr("10.206.9.14"), ConfigFile: "vpcnid.yaml"}
		step := func(cfg openstack.Config) provider.Step {
			t.Helper()
			for _, s := range openstack.Diagnose(ctx(t), cfg, node) {
				if s.Err != nil {
					t.Fatalf("doctor step %s failed: %v", s.Name, s.Err)
				}
				if s.Name == "ipv6" {
					return s
				}
			}
			t.Fatal("doctor has no ipv6 step for a VM port with IPv6 addresses")
			return provider.Step{}
		}
		s := step(cfgOf())
		if s.Warn || !strings.Contains(s.Detail, stateful) || !strings.Contains(s.Detail, slaac) ||
			!strings.Contains(s.Detail, `ipv6_address_mode "dhcpv6-stateful"`) || !strings.Contains(s.Detail, "takes named fixed IPs") || !strings.Contains(s.Detail, "auto-address") {
			t.Fatalf("doctor's ipv6 step: %+v; want both subnets with their modes, the stateful one taking named fixed IPs, no warning", s)
		}
		cfg := cfgOf()
		cfg.SubnetIDv6 = slaac
		if s := step(cfg); !s.Warn || !strings.Contains(s.Fix, "subnetIDv6") {
			t.Fatalf("doctor with a SLAAC subnetIDv6: %+v; want a warning naming subnetIDv6", s)
		}
		t.Logf("vpcni-test: doctor: %s", s.Detail)
	})

	t.Run("SLAACConfiguredRefused", func(t *testing.T) {
		t.Parallel() // one VM port each, on the shared subnets
		vm(t, ports.IP{SubnetID: v4.ID, IPAddress: "10.206.9.11"})
		cfg := cfgOf()
		cfg.SubnetIDv6 = slaac
		_, err := openstack.NewFamilies(ctx(t), cfg, netip.MustParseAddr("10.206.9.11"), fams)
		if err == nil || !strings.Contains(err.Error(), "AllocationOnAutoAddressSubnet") || !strings.Contains(err.Error(), "dhcpv6-stateful") || !strings.Contains(err.Error(), "subnetIDv6") {
			t.Fatalf("subnetIDv6 on a SLAAC subnet: %v; want refused with the reason and what to set", err)
		}
		t.Logf("vpcni-test: a SLAAC subnetIDv6 is refused: %v", err)
	})

	t.Run("OnlySLAACFound", func(t *testing.T) {
		t.Parallel()                                               // one VM port each, on the shared subnets
		vm(t, ports.IP{SubnetID: v4.ID, IPAddress: "10.206.9.12"}) // Neutron adds the SLAAC one
		_, err := openstack.NewFamilies(ctx(t), cfgOf(), netip.MustParseAddr("10.206.9.12"), fams)
		if err == nil || !strings.Contains(err.Error(), "auto-address") || !strings.Contains(err.Error(), slaac) {
			t.Fatalf("a VM port whose only v6 address is SLAAC: %v; want refused naming the subnet", err)
		}
	})

	t.Run("ModeServesIPv4Only", func(t *testing.T) {
		t.Parallel() // one VM port each, on the shared subnets
		vm(t, ports.IP{SubnetID: v4.ID, IPAddress: "10.206.9.13"}, ports.IP{SubnetID: stateful, IPAddress: "fd00:69:2::d"})
		cfg := cfgOf()
		cfg.Mode = "address-pairs"
		_, err := openstack.NewFamilies(ctx(t), cfg, netip.MustParseAddr("10.206.9.13"), fams)
		if err == nil || !strings.Contains(err.Error(), "mode fixed-ips") {
			t.Fatalf("mode address-pairs with ipv6: %v; want refused naming mode fixed-ips", err)
		}
	})
}

// TestIPv6PrefixPair: modeV6 prefix-pair on a SLAAC subnet, where Neutron
// refuses named fixed IPs: each node's /96 block of prefixRangeV6 (by its
// place in the IPv4 subnet) is one allowed address pair on its VM port,
// written once; IPv6 addresses handed out of it cost one description
// write per batch, survive a restart, and go back; a range overlapping an
// allocation pool, and a block another port allows, are refused at start.
func TestIPv6PrefixPair(t *testing.T) {
	t.Parallel()
	ep := realNeutron{}.ep()
	netID := newNetwork(t, ep)
	v4 := ep.AddSubnet(t, netID, "10.206.11.0/24", 100)
	v6 := v6subnet(t, netID, "fd00:6b:11::/64", "slaac", "slaac") // pool ::2-::ff
	fams := []family.Family{family.V4, family.V6}
	node := func(t *testing.T, ip string) string {
		t.Helper()
		p, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID, DeviceOwner: "compute:vpcni-test",
			FixedIPs: []ports.IP{{SubnetID: v4.ID, IPAddress: ip}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ports.Delete(ctx(t), nc, p.ID).ExtractErr() })
		return p.ID
	}
	cfgOf := func(rg string) openstack.Config {
		cfg := openstack.Config{Endpoint: endpoint, SubnetID: v4.ID, SubnetIDv6: v6, ModeV6: "prefix-pair", PrefixRangeV6: rg}
		cfg.Defaults()
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const rg = "fd00:6b:11:0:1::/80"
	portA := node(t, "10.206.11.10")
	node(t, "10.206.11.11")
	open := func(t *testing.T, ip string) *openstack.Provider {
		t.Helper()
		p, err := openstack.NewFamilies(ctx(t), cfgOf(rg), netip.MustParseAddr(ip), fams)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := open(t, "10.206.11.10")
	block := netip.MustParsePrefix("fd00:6b:11:0:1:a::/96") // the 10th block
	pairs := func() []string {
		port, err := ports.Get(ctx(t), nc, portA).Extract()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ap := range port.AllowedAddressPairs {
			out = append(out, ap.IPAddress)
		}
		return out
	}
	puts := a.Info().Calls["PUT"]
	got, err := a.Assign(ctx(t), provider.AssignRequest{Count: 5, Family: family.V6})
	if err != nil || len(got) != 5 {
		t.Fatalf("Assign(5, ipv6) = %v, %v", got, err)
	}
	for _, l := range got {
		if !block.Contains(l.Address) || l.Prefix != netip.MustParsePrefix("fd00:6b:11::/64") {
			t.Fatalf("lease %+v: want an address of block %s on the subnet's prefix", l, block)
		}
	}
	if p := pairs(); !slices.Equal(p, []string{block.String()}) {
		t.Fatalf("VM port pairs %v, want the node's block %s alone", p, block)
	}
	if d := a.Info().Calls["PUT"] - puts; d != 2 {
		t.Errorf("the pair and 5 addresses took %d PUTs, want 2 (the pair once, one batch of marks)", d)
	}
	puts = a.Info().Calls["PUT"]
	more, err := a.Assign(ctx(t), provider.AssignRequest{Count: 3, Family: family.V6})
	if err != nil || len(more) != 3 || a.Info().Calls["PUT"]-puts != 1 {
		t.Fatalf("Assign(3, ipv6) again = %v, %v, %d PUTs; want 3 in one write and the pair not written again", more, err, a.Info().Calls["PUT"]-puts)
	}
	v4got, err := a.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err != nil || len(v4got) != 2 {
		t.Fatalf("IPv4 beside the block: %v, %v", v4got, err)
	}
	// Someone writes the description meanwhile: the provider's copy is
	// stale, its write is turned back (412) and planned again, and the
	// text is kept beside both families' marks.
	port, err := ports.Get(ctx(t), nc, portA).Extract()
	if err != nil {
		t.Fatal(err)
	}
	desc, rev := "owned by team x "+port.Description, port.RevisionNumber
	if _, err := ports.Update(ctx(t), nc, portA, ports.UpdateOpts{Description: &desc, RevisionNumber: &rev}).Extract(); err != nil {
		t.Fatal(err)
	}
	late, err := a.Assign(ctx(t), provider.AssignRequest{Count: 1, Family: family.V6})
	if err != nil || len(late) != 1 {
		t.Fatalf("Assign on a stale copy of the port: %v, %v", late, err)
	}
	if port, _ = ports.Get(ctx(t), nc, portA).Extract(); !strings.Contains(port.Description, "owned by team x") || !strings.Contains(port.Description, "[vpcni:") || !strings.Contains(port.Description, "[vpcni6b:") {
		t.Fatalf("description %q: want the hand-written text and both families' marks", port.Description)
	}
	t.Logf("vpcni-test: description %q", port.Description)
	if err := a.Release(ctx(t), []netip.Addr{late[0].Address}); err != nil {
		t.Fatal(err)
	}
	// A restart finds both families.
	a2 := open(t, "10.206.11.10")
	held, err := a2.Held(ctx(t))
	if err != nil || len(held) != 10 {
		t.Fatalf("after restart Held = %v, %v; want 2 IPv4 and 8 IPv6", held, err)
	}
	if err := a2.Release(ctx(t), []netip.Addr{got[0].Address, got[1].Address, v4got[0].Address}); err != nil {
		t.Fatal(err)
	}
	if held, err := a2.Held(ctx(t)); err != nil || len(held) != 7 || slices.ContainsFunc(held, func(l alloc.Lease) bool { return l.Address == got[0].Address }) {
		t.Fatalf("after releasing 3 Held = %v, %v", held, err)
	}
	// A pair knocked off by hand comes back with the next Held.
	port, _ = ports.Get(ctx(t), nc, portA).Extract()
	none := []ports.AddressPair{}
	rev = port.RevisionNumber
	if _, err := ports.Update(ctx(t), nc, portA, ports.UpdateOpts{AllowedAddressPairs: &none, RevisionNumber: &rev}).Extract(); err != nil {
		t.Fatal(err)
	}
	if _, err := a2.Held(ctx(t)); err != nil || !slices.Equal(pairs(), []string{block.String()}) {
		t.Fatalf("after the pair was removed by hand, Held: %v; pairs %v", err, pairs())
	}
	// Node .11 takes the 11th block, beside.
	b := open(t, "10.206.11.11")
	bl, err := b.Assign(ctx(t), provider.AssignRequest{Count: 1, Family: family.V6})
	if err != nil || len(bl) != 1 || !netip.MustParsePrefix("fd00:6b:11:0:1:b::/96").Contains(bl[0].Address) {
		t.Fatalf("node .11: %v, %v; want an address of the 11th block", bl, err)
	}
	t.Logf("vpcni-test: %s; capacities %v", a2.Info().Subnet, a2.Info().Capacities)

	t.Run("RangeOverPoolRefused", func(t *testing.T) {
		t.Parallel()
		_, err := openstack.NewFamilies(ctx(t), cfgOf("fd00:6b:11::/80"), netip.MustParseAddr("10.206.11.10"), fams)
		if err == nil || !strings.Contains(err.Error(), "allocation pool") {
			t.Fatalf("a range over the allocation pool: %v; want refused naming the pool", err)
		}
		t.Logf("vpcni-test: %v", err)
	})
	t.Run("BlockTakenRefused", func(t *testing.T) {
		t.Parallel()
		node(t, "10.206.11.12")
		taken := []ports.AddressPair{{IPAddress: "fd00:6b:11:0:1:c:0:0/112"}}
		other, err := ports.Create(ctx(t), nc, ports.CreateOpts{NetworkID: netID, AllowedAddressPairs: taken, FixedIPs: []ports.IP{{SubnetID: v4.ID}}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ports.Delete(ctx(t), nc, other.ID).ExtractErr() })
		_, err = openstack.NewFamilies(ctx(t), cfgOf(rg), netip.MustParseAddr("10.206.11.12"), fams)
		if err == nil || !strings.Contains(err.Error(), other.ID) {
			t.Fatalf("a block another port allows: %v; want refused naming port %s", err, other.ID)
		}
	})
}

// TestIPv6TakeOffAndLeaks: a dual-stack node's IPv6 pod addresses are
// freed from its VM port like its IPv4 ones when the node is gone. The
// leak audit reads the "[vpcni6:...]" marks (against the subnet of the
// port's IPv6 fixed IPs) and lists each marked IPv6 address, the node's
// own IPv6 address among its NodeIPs, not as a pod's; the collector's
// Release takes one IPv6 address off, fixed IP and mark together; the
// sticky keeper's TakeOff takes an address of each family off in one
// call. The node, restarted, holds exactly what was not taken.
func TestIPv6TakeOffAndLeaks(t *testing.T) {
	t.Parallel()
	ep := realNeutron{mode: "fixed-ips"}.ep()
	netID := newNetwork(t, ep)
	v4 := ep.AddSubnet(t, netID, "10.206.12.0/24", 100)
	v6 := ep.AddSubnet(t, netID, "fd00:6b:12::/64", 100)
	nodeIP, nodeIP6 := netip.MustParseAddr("10.206.12.10"), netip.MustParseAddr("fd00:6b:12::a")
	node := ep.NewDualNode(t, v4, v6, nodeIP, nodeIP6)
	assign := func(n int, f family.Family) []netip.Addr {
		ls, err := node.Provider.Assign(ctx(t), provider.AssignRequest{Count: n, Family: f})
		if err != nil || len(ls) != n {
			t.Fatalf("Assign(%d, %s) = %v, %v", n, f, ls, err)
		}
		var out []netip.Addr
		for _, l := range ls {
			out = append(out, l.Address)
		}
		return out
	}
	pods4, pods6 := assign(2, family.V4), assign(3, family.V6)

	cfg := openstack.Config{Endpoint: endpoint, SubnetID: v4.ID, Mode: "fixed-ips"}
	cfg.Defaults()
	lk := &cluster.Leaks{NC: nc, OpenStack: &cfg, ClusterID: "v6-takeoff", Log: slog.New(slog.DiscardHandler)}
	fixed := func() map[netip.Addr]leaks.Holding {
		hs, err := lk.Holdings(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		out := map[netip.Addr]leaks.Holding{}
		for _, h := range hs {
			if h.Kind == leaks.FixedIP && h.Resource == node.PortID {
				if h.Unreadable != "" {
					t.Fatalf("the audit could not read port %s: %s", node.PortID, h.Unreadable)
				}
				out[netip.MustParseAddr(h.Address)] = h
			}
		}
		return out
	}
	want := func(addrs ...netip.Addr) {
		t.Helper()
		got := fixed()
		if len(got) != len(addrs) {
			t.Fatalf("the audit lists %d pod addresses on the node's port (%v), want %v", len(got), slices.SortedFunc(maps.Keys(got), netip.Addr.Compare), addrs)
		}
		for _, a := range addrs {
			h, ok := got[a]
			if !ok {
				t.Fatalf("the audit lists %v, not %s", slices.SortedFunc(maps.Keys(got), netip.Addr.Compare), a)
			}
			if !slices.Equal(h.NodeIPs, []netip.Addr{nodeIP, nodeIP6}) {
				t.Fatalf("holding %s: node IPs %v, want the node's own %s and %s alone", a, h.NodeIPs, nodeIP, nodeIP6)
			}
		}
		on := node.PortIPs(t)
		for _, a := range addrs {
			if !slices.Contains(on, a) {
				t.Fatalf("port holds %v: %s missing", on, a)
			}
		}
	}
	want(append(slices.Clone(pods4), pods6...)...)

	// The collector releases one IPv6 address.
	if err := lk.Release(ctx(t), fixed()[pods6[0]]); err != nil {
		t.Fatalf("Release %s: %v", pods6[0], err)
	}
	if on := node.PortIPs(t); slices.Contains(on, pods6[0]) || !slices.Contains(on, nodeIP6) {
		t.Fatalf("after Release the port holds %v: want %s off and the node's own %s kept", on, pods6[0], nodeIP6)
	}
	want(pods4[0], pods4[1], pods6[1], pods6[2])

	// The sticky keeper takes one address of each family off.
	if err := openstack.TakeOff(ctx(t), cfg, node.PortID, []netip.Addr{pods4[0], pods6[1]}); err != nil {
		t.Fatalf("TakeOff: %v", err)
	}
	want(pods4[1], pods6[2])
	// Asked again (the keeper retrying), nothing is left to take.
	if err := openstack.TakeOff(ctx(t), cfg, node.PortID, []netip.Addr{pods4[0], pods6[1]}); err != nil {
		t.Fatalf("TakeOff again: %v", err)
	}
	// The node's own addresses are never vpcni's to take.
	if err := openstack.TakeOff(ctx(t), cfg, node.PortID, []netip.Addr{nodeIP6}); err == nil || !strings.Contains(err.Error(), "did not put") {
		t.Fatalf("TakeOff of the node's own IPv6 address: %v, want refused", err)
	}
	held, err := node.Reopen(t).Held(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for _, l := range held {
		got = append(got, l.Address)
	}
	if !slices.Equal(got, []netip.Addr{pods4[1], pods6[2]}) {
		t.Fatalf("the node restarted holds %v, want %v", got, []netip.Addr{pods4[1], pods6[2]})
	}
}
