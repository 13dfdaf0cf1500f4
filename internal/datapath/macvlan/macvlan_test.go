package macvlan

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
)

func TestSettings(t *testing.T) {
	var s Settings
	s.Defaults()
	if len(s.ServiceCIDRs) != 1 || s.ServiceCIDRs[0] != DefaultServiceCIDR {
		t.Fatalf("defaults: %+v", s)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	bad := Settings{Settings: svcpath.Settings{ServiceCIDRs: []string{"10.96.0.0/12", "nope", "10.96.0.1/12", "::ffff:10.96.0.0/108", "0.0.0.0/0", "fd00:96::/112", "::/0"}}, Parent: "eth0/1"}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad settings accepted")
	}
	for _, want := range []string{"serviceCIDRs[1]", "serviceCIDRs[2]: \"10.96.0.1/12\" has host bits set (did you mean 10.96.0.0/12?)",
		"serviceCIDRs[3]: \"::ffff:10.96.0.0/108\" is neither", "serviceCIDRs[4]", "serviceCIDRs[6]", "parent: \"eth0/1\""} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "serviceCIDRs[0]") || strings.Contains(err.Error(), "serviceCIDRs[5]") {
		t.Errorf("a good CIDR was named: %v", err)
	}
}

func TestCheckLease(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.70")
	pfx, gw := netip.MustParsePrefix("10.0.0.0/24"), netip.MustParseAddr("10.0.0.1")
	if err := checkLease(MACVLAN, alloc.Lease{Address: ip, Prefix: pfx, Gateway: gw}); err != nil {
		t.Fatalf("good lease refused: %v", err)
	}
	for _, c := range []struct {
		lease alloc.Lease
		says  []string
	}{
		{alloc.Lease{Address: ip, Prefix: pfx}, []string{"has no gateway", "datapath macvlan needs both", "gateway_ip"}},
		{alloc.Lease{Address: ip, Gateway: gw}, []string{"has no subnet prefix"}},
		{alloc.Lease{Address: ip}, []string{"has no subnet prefix", "has no gateway"}},
		{alloc.Lease{Address: ip, Prefix: netip.MustParsePrefix("10.1.0.0/24"), Gateway: gw}, []string{"outside its subnet", "gateway 10.0.0.1 is outside"}},
		{alloc.Lease{Address: ip, Prefix: pfx, Gateway: gw, NIC: &alloc.NIC{MAC: "fa:16:3e:00:00:01"}}, []string{"lives on a NIC of its own", "datapath passthrough", "veth for secondary NICs"}},
	} {
		err := checkLease(MACVLAN, c.lease)
		if err == nil {
			t.Errorf("lease %+v accepted", c.lease)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("lease %+v: error %q does not say %q", c.lease, err, s)
			}
		}
	}
}

// A lease without a gateway is refused before anything is touched (no
// root needed: Setup stops at the lease), naming what the provider lacks.
func TestSetupRefusesLeaseWithoutGateway(t *testing.T) {
	for _, k := range []Kind{MACVLAN, IPVLAN} {
		m := &Mode{kind: k, svc: svcpath.New(nil, nil, 1500, false)}
		a := &alloc.Allocation{ContainerID: "c", IfName: "eth0", Netns: "/nonexistent",
			Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.70"), Prefix: netip.MustParsePrefix("10.0.0.0/24")}}
		_, err := m.Setup(context.Background(), a)
		var se *datapath.SetupError
		if !errors.As(err, &se) || se.Step != "lease" || !strings.Contains(err.Error(), "has no gateway") || !strings.Contains(err.Error(), "datapath "+string(k)) {
			t.Errorf("%s: got %v", k, err)
		}
	}
}

func TestSetupRefusesServiceVethName(t *testing.T) {
	m := &Mode{kind: MACVLAN, svc: svcpath.New(nil, nil, 1500, false)}
	a := &alloc.Allocation{ContainerID: "c", IfName: svcpath.PodIfName, Netns: "/nonexistent",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.70"), Prefix: netip.MustParsePrefix("10.0.0.0/24"), Gateway: netip.MustParseAddr("10.0.0.1")}}
	_, err := m.Setup(context.Background(), a)
	var se *datapath.SetupError
	if !errors.As(err, &se) || !se.BadRequest || !strings.Contains(err.Error(), "service veth") {
		t.Fatalf("got %v", err)
	}
}

// The link each kind builds: macvlan in bridge mode with the address's
// MAC, ipvlan L2 with the parent's (none set); both on the parent, born in
// the pod's namespace.
func TestNewLink(t *testing.T) {
	a := &alloc.Allocation{ContainerID: "c", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.70")}}
	mv := (&Mode{kind: MACVLAN, parentIdx: 7, mtu: 1450}).newLink(a, 42)
	m, ok := mv.(*netlink.Macvlan)
	if !ok || m.Mode != netlink.MACVLAN_MODE_BRIDGE || m.HardwareAddr.String() != "0a:58:0a:00:00:46" ||
		m.ParentIndex != 7 || m.MTU != 1450 || m.Name != "eth0" || m.Namespace != netlink.NsFd(42) {
		t.Errorf("macvlan link: %#v", mv)
	}
	iv := (&Mode{kind: IPVLAN, parentIdx: 7, mtu: 1450}).newLink(a, 42)
	i, ok := iv.(*netlink.IPVlan)
	if !ok || i.Mode != netlink.IPVLAN_MODE_L2 || i.HardwareAddr != nil || i.ParentIndex != 7 || i.Namespace != netlink.NsFd(42) {
		t.Errorf("ipvlan link: %#v", iv)
	}
	if i.Type() != "ipvlan" || m.Type() != "macvlan" {
		t.Errorf("types %q %q", i.Type(), m.Type())
	}
}

func TestWiringAndInfo(t *testing.T) {
	// The IPv6 Service CIDR and node address are routed only for a pod
	// with an IPv6 address (below).
	svc := svcpath.New([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/112")},
		[]netip.Addr{netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("fd00:10::10")}, 1500, true)
	a := &alloc.Allocation{ContainerID: "c", IfName: "eth0", Netns: "/run/netns/p",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.70"), Prefix: netip.MustParsePrefix("10.0.0.0/24"), Gateway: netip.MustParseAddr("10.0.0.1")}}
	for _, k := range []Kind{MACVLAN, IPVLAN} {
		w := (&Mode{kind: k, svc: svc}).wiring(a)
		a.Wiring = &w
		if len(w.Interfaces) != 3 || w.Interfaces[0].Sandbox != "" || w.Interfaces[1].Name != "eth0" || w.Interfaces[2].Name != svcpath.PodIfName {
			t.Fatalf("%s interfaces: %+v", k, w.Interfaces)
		}
		if a.HostIf() != svcpath.HostIfName("c", "eth0") || a.PodGateway() != a.Gateway {
			t.Errorf("%s: host if %q, gateway %s", k, a.HostIf(), a.PodGateway())
		}
		if want := map[Kind]string{MACVLAN: "0a:58:0a:00:00:46", IPVLAN: ""}[k]; a.PodMAC() != want {
			t.Errorf("%s: pod MAC %q, want %q", k, a.PodMAC(), want)
		}
		if w.IPs[0].Address.String() != "10.0.0.70/24" {
			t.Errorf("%s: IP %s", k, w.IPs[0].Address)
		}
		var routes []string
		for _, r := range w.Routes {
			routes = append(routes, r.Dst.String()+" via "+r.GW.String())
		}
		if got := strings.Join(routes, ","); got != "0.0.0.0/0 via 10.0.0.1,10.96.0.0/12 via 169.254.1.1,10.0.0.10/32 via 169.254.1.1" {
			t.Errorf("%s routes: %s", k, got)
		}
		if info := (&Mode{kind: k, uplink: "lo-nonexistent"}).Info(); info.OwnMACs != (k == MACVLAN) || info.Mode != string(k) {
			t.Errorf("%s info: %+v", k, info)
		}
	}
}

// A dual-stack pod: an IPConfig and a default route per lease, in lease
// order, then each family's service routes; an IPv6 lease's gateway may
// be the router's link-local address.
func TestWiringDualStack(t *testing.T) {
	svc := svcpath.New([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/112")},
		[]netip.Addr{netip.MustParseAddr("10.0.0.10"), netip.MustParseAddr("fd00:10::10")}, 1500, true)
	v6 := alloc.Lease{Address: netip.MustParseAddr("fd00:10::70"), Prefix: netip.MustParsePrefix("fd00:10::/64"), Gateway: netip.MustParseAddr("fe80::1:1")}
	a := &alloc.Allocation{ContainerID: "c", IfName: "eth0", Netns: "/run/netns/p",
		Lease:  alloc.Lease{Address: netip.MustParseAddr("10.0.0.70"), Prefix: netip.MustParsePrefix("10.0.0.0/24"), Gateway: netip.MustParseAddr("10.0.0.1")},
		Others: []alloc.Lease{v6}}
	if err := checkLeases(MACVLAN, a); err != nil {
		t.Fatalf("link-local IPv6 gateway refused: %v", err)
	}
	bad := *a
	bad.Others = []alloc.Lease{{Address: v6.Address, Prefix: v6.Prefix, Gateway: netip.MustParseAddr("fd00:11::1")}}
	if err := checkLeases(MACVLAN, &bad); err == nil || !strings.Contains(err.Error(), "outside its subnet") {
		t.Errorf("gateway off the subnet: %v", err)
	}
	w := (&Mode{kind: MACVLAN, svc: svc}).wiring(a)
	a.Wiring = &w
	if len(w.IPs) != 2 || w.IPs[1].Address.String() != "fd00:10::70/64" || a.GatewayOf(v6.Address) != v6.Gateway {
		t.Fatalf("IPs %+v", w.IPs)
	}
	var routes []string
	for _, r := range w.Routes {
		routes = append(routes, r.Dst.String()+" via "+r.GW.String())
	}
	want := "0.0.0.0/0 via 10.0.0.1,::/0 via fe80::1:1,10.96.0.0/12 via 169.254.1.1,10.0.0.10/32 via 169.254.1.1,fd00:96::/112 via fe80::1,fd00:10::10/128 via fe80::1"
	if got := strings.Join(routes, ","); got != want {
		t.Errorf("routes\n got %s\nwant %s", got, want)
	}
	if r, _ := datapath.Lookup("macvlan"); len(r.Families) != 2 {
		t.Errorf("macvlan declares families %v", r.Families)
	}
}

func TestRegistered(t *testing.T) {
	r, err := datapath.Lookup("macvlan")
	if err != nil || r.Prepare == nil {
		t.Fatalf("macvlan: %v", err)
	}
	if len(svcpath.HostIfName(strings.Repeat("c", 64), "eth0")) != 15 {
		t.Errorf("host name not 15 bytes")
	}
}
