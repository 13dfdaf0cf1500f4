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
	bad := Settings{Settings: svcpath.Settings{ServiceCIDRs: []string{"10.96.0.0/12", "nope", "10.96.0.1/12", "fd00::/108", "0.0.0.0/0"}}, Parent: "eth0/1"}
	err := bad.Validate()
	if err == nil {
		t.Fatal("bad settings accepted")
	}
	for _, want := range []string{"serviceCIDRs[1]", "serviceCIDRs[2]: \"10.96.0.1/12\" has host bits set (did you mean 10.96.0.0/12?)",
		"serviceCIDRs[3]", "serviceCIDRs[4]", "parent: \"eth0/1\""} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "serviceCIDRs[0]") {
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
		m := &Mode{kind: k, svc: svcpath.New(nil, netip.Addr{}, 1500)}
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
	m := &Mode{kind: MACVLAN, svc: svcpath.New(nil, netip.Addr{}, 1500)}
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
	node := netip.MustParseAddr("10.0.0.10")
	svc := svcpath.New([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}, node, 1500)
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

func TestRegistered(t *testing.T) {
	r, err := datapath.Lookup("macvlan")
	if err != nil || r.Prepare == nil {
		t.Fatalf("macvlan: %v", err)
	}
	if len(svcpath.HostIfName(strings.Repeat("c", 64), "eth0")) != 15 {
		t.Errorf("host name not 15 bytes")
	}
}
