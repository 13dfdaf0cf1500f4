package bridge

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
)

func TestSettings(t *testing.T) {
	s := Settings{}
	s.Defaults()
	if s.Bridge != DefaultBridge || s.Validate() != nil {
		t.Fatalf("defaults: %+v, %v", s, s.Validate())
	}
	for _, bad := range []string{"a-name-longer-than-15", "br/0", "br:0", "br 0", "brü"} {
		s := Settings{Bridge: bad}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "bridge: ") {
			t.Errorf("bridge %q: got %v, want an error naming the field", bad, err)
		}
	}
}

func TestLeaseError(t *testing.T) {
	ip := netip.MustParseAddr("10.1.0.5")
	pfx := netip.MustParsePrefix("10.1.0.0/24")
	gw := netip.MustParseAddr("10.1.0.1")
	ok := alloc.Lease{Address: ip, Prefix: pfx, Gateway: gw}
	if err := leaseError(&alloc.Allocation{Lease: ok}); err != nil {
		t.Fatalf("good lease refused: %v", err)
	}
	ok6 := alloc.Lease{Address: netip.MustParseAddr("fd00::5"), Prefix: netip.MustParsePrefix("fd00::/64"), Gateway: netip.MustParseAddr("fd00::1")}
	ll6 := ok6
	ll6.Gateway = netip.MustParseAddr("fe80::1")
	for _, l := range []alloc.Lease{ok6, ll6} {
		if err := leaseError(&alloc.Allocation{Lease: ok, Others: []alloc.Lease{l}}); err != nil {
			t.Errorf("good dual-stack lease (v6 gateway %s) refused: %v", l.Gateway, err)
		}
	}
	for name, c := range map[string]struct {
		l    alloc.Lease
		want string
	}{
		"no prefix":         {alloc.Lease{Address: ip, Gateway: gw}, "no subnet prefix"},
		"no gateway":        {alloc.Lease{Address: ip, Prefix: pfx}, "no gateway"},
		"address elsewhere": {alloc.Lease{Address: netip.MustParseAddr("10.2.0.5"), Prefix: pfx, Gateway: gw}, "does not contain"},
		"gateway elsewhere": {alloc.Lease{Address: ip, Prefix: pfx, Gateway: netip.MustParseAddr("10.2.0.1")}, "not another address"},
		"gateway is pod":    {alloc.Lease{Address: ip, Prefix: pfx, Gateway: ip}, "not another address"},
		"IPv6 no prefix":    {alloc.Lease{Address: netip.MustParseAddr("fd00::5")}, "no subnet prefix"},
		"IPv6 gateway v4":   {alloc.Lease{Address: netip.MustParseAddr("fd00::5"), Prefix: netip.MustParsePrefix("fd00::/64"), Gateway: gw}, "not another address"},
		"on a NIC":          {alloc.Lease{Address: ip, Prefix: pfx, Gateway: gw, NIC: &alloc.NIC{MAC: "fa:16:3e:00:00:01"}}, "lives on a NIC of its own"},
	} {
		if err := leaseError(&alloc.Allocation{Lease: c.l}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
	}
}

// TestSetupRefusesBadLease: a lease bridge mode cannot wire is refused
// before anything is made, with the reason.
func TestSetupRefusesBadLease(t *testing.T) {
	b := &Bridge{name: "vpcni-none", uplink: "none", mtu: 1500}
	a := &alloc.Allocation{ContainerID: "c", IfName: "eth0", Netns: "/nonexistent",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.1.0.5"), Prefix: netip.MustParsePrefix("10.1.0.0/24")}}
	_, err := b.Setup(t.Context(), a)
	var se *SetupError
	if !errors.As(err, &se) || se.Step != "lease" || se.BadRequest || !strings.Contains(err.Error(), "no gateway") {
		t.Fatalf("got %v, want a SetupError at step lease naming the gateway", err)
	}
}

func TestRelabel(t *testing.T) {
	for _, c := range [][4]string{
		{"eth0", "eth0", "vpcbr0", "vpcbr0"},
		{"eth0:1", "eth0", "vpcbr0", "vpcbr0:1"},
		{"vpcbr0:x", "vpcbr0", "eth0", "eth0:x"},
		{"", "eth0", "vpcbr0", ""},
	} {
		if got := relabel(c[0], c[1], c[2]); got != c[3] {
			t.Errorf("relabel(%q, %q, %q) = %q, want %q", c[0], c[1], c[2], got, c[3])
		}
	}
}

// inFreshNetns runs f on a thread of its own in a new network namespace,
// which goes with the thread (it is never unlocked).
func inFreshNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("NOT RUN: needs root to create a network namespace (make test runs it as root)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with its netns
		ns, err := netns.New()
		if err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		defer ns.Close()
		f()
	}()
	<-done
}

func sh(t *testing.T, cmd string) string {
	t.Helper()
	out, err := exec.Command("sh", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Errorf("%s: %v\n%s", cmd, err, out)
	}
	return string(out)
}

// TestTakeAndGiveBackUplink moves a node's IPv4 life onto the bridge and
// back, in a namespace of its own, and compares `ip -d` state exactly.
func TestTakeAndGiveBackUplink(t *testing.T) {
	inFreshNetns(t, func() {
		for _, c := range []string{
			"ip link add eth0 mtu 1450 type veth peer name peer0",
			"ip link set eth0 up", "ip link set peer0 up", "ip link set lo up",
			"ip addr add 10.99.0.10/24 dev eth0",
			"ip addr add 10.99.0.11/24 dev eth0 label eth0:sec",
			"ip addr add 10.98.0.10/16 dev eth0",
			"ip route add default via 10.99.0.1 dev eth0 proto static metric 100",
			"ip route add 10.50.0.0/16 via 10.99.0.2 dev eth0 src 10.99.0.11 metric 7",
			"ip route add default via 10.99.0.1 dev eth0 table 100",
			"ip route add 10.60.0.0/16 dev eth0 scope link proto 42 table 100",
			"ip neigh add 10.99.0.77 lladdr 02:00:00:00:00:77 dev eth0 nud permanent",
			// IPv6 moves too: global addresses, routes, permanent neighbours.
			"ip addr add 2001:db8:99::10/64 dev eth0 nodad",
			"ip -6 route add default via 2001:db8:99::1 dev eth0 metric 100",
			"ip -6 route add 2001:db8:50::/48 via 2001:db8:99::2 dev eth0 table 100",
			"ip -6 neigh add 2001:db8:99::77 lladdr 02:00:00:00:00:78 dev eth0 nud permanent",
		} {
			sh(t, c)
		}
		state := func(dev string) string {
			return sh(t, "ip -d -4 addr show dev "+dev+" | grep '^ *inet\\|^ *valid'; ip -4 route show table all | grep -v '^local\\|^broadcast'; ip -4 neigh show nud permanent; "+
				"ip -6 addr show dev "+dev+" scope global | grep '^ *inet6\\|^ *valid'; ip -6 route show table all | grep -v '^local\\|^multicast\\|^anycast\\|^fe80'; ip -6 neigh show nud permanent")
		}
		before := state("eth0")
		for _, w := range []string{"inet6 2001:db8:99::10/64", "default via 2001:db8:99::1 dev eth0", "2001:db8:50::/48 via", "2001:db8:99::77"} {
			if !strings.Contains(before, w) {
				t.Errorf("the state compared lacks %q:\n%s", w, before)
			}
		}
		link := sh(t, "ip -d link show eth0 | grep -v 'master\\|bridge_slave\\|promiscuity'")
		if t.Failed() {
			return
		}
		uplink, err := findUplink("", DefaultBridge)
		if err != nil || uplink != "eth0" {
			t.Errorf("findUplink = %q, %v; want eth0 (the default route's)", uplink, err)
			return
		}
		br, err := takeUplink(uplink, DefaultBridge, false)
		if err != nil {
			t.Errorf("take uplink: %v", err)
			return
		}
		up, _ := netlink.LinkByName("eth0")
		if up.Attrs().MasterIndex != br.Attrs().Index || br.Attrs().HardwareAddr.String() != up.Attrs().HardwareAddr.String() || br.Attrs().MTU != 1450 {
			t.Errorf("bridge %s (mac %s mtu %d) should hold eth0 (master %d, mac %s) with its MAC and MTU", br.Attrs().Name, br.Attrs().HardwareAddr, br.Attrs().MTU, up.Attrs().MasterIndex, up.Attrs().HardwareAddr)
		}
		if on, err := nfCallIptables(br.Attrs().Index); !on || err != nil {
			t.Errorf("nf_call_iptables = %v, %v; want on", on, err)
		}
		if got := sh(t, "ip -4 addr show dev eth0"); strings.Contains(got, "inet ") {
			t.Errorf("eth0 kept IPv4 addresses:\n%s", got)
		}
		moved := state(DefaultBridge)
		if want := strings.NewReplacer("eth0", DefaultBridge).Replace(before); moved != want {
			t.Errorf("the bridge does not hold exactly what eth0 held:\n--- want\n%s--- got\n%s", want, moved)
		}
		// Again, as a restarted agent does: the uplink is found behind the
		// bridge and nothing changes.
		if uplink, err = findUplink("", DefaultBridge); err != nil || uplink != "eth0" {
			t.Errorf("findUplink after the move = %q, %v; want eth0 (the bridge's port)", uplink, err)
		}
		if br2, err := takeUplink("eth0", DefaultBridge, false); err != nil || br2.Attrs().Index != br.Attrs().Index {
			t.Errorf("second take: %v (bridge index %d, was %d)", err, br2.Attrs().Index, br.Attrs().Index)
		}
		if again := state(DefaultBridge); again != moved {
			t.Errorf("a second take changed the state:\n%s\nvs\n%s", moved, again)
		}
		// A pod link left on the bridge goes with it.
		sh(t, "ip link add vpbleft type veth peer name vpbleftp && ip link set vpbleft alias vpcni:c1/eth0 master "+DefaultBridge)
		if err := Uninstall("", Settings{}); err != nil {
			t.Errorf("uninstall: %v", err)
		}
		if after := state("eth0"); after != before {
			t.Errorf("uninstall did not restore eth0 exactly:\n--- before\n%s--- after\n%s", before, after)
		}
		if after := sh(t, "ip -d link show eth0 | grep -v 'master\\|bridge_slave\\|promiscuity'"); after != link {
			t.Errorf("eth0's link changed:\n%s\nvs\n%s", link, after)
		}
		if out := sh(t, "ip -o link show"); strings.Contains(out, DefaultBridge) || strings.Contains(out, "vpbleft") {
			t.Errorf("bridge or pod link left:\n%s", out)
		}
		if err := Uninstall("", Settings{}); err != nil {
			t.Errorf("second uninstall (nothing to undo): %v", err)
		}
	})
}

// TestRefusals: what bridge mode must not take over.
func TestRefusals(t *testing.T) {
	inFreshNetns(t, func() {
		sh(t, "ip link add eth0 type veth peer name peer0 && ip link set eth0 up && ip addr add 10.99.0.10/24 dev eth0")
		sh(t, "ip link add other type bridge && ip link add eth1 type veth peer name peer1 && ip link set eth1 master other")
		if _, err := findUplink("eth1", DefaultBridge); err == nil || !strings.Contains(err.Error(), "already a port of other") {
			t.Errorf("uplink on another bridge: %v", err)
		}
		if _, err := takeUplink("eth0", "other", false); err == nil || !strings.Contains(err.Error(), "not a bridge vpcni made") {
			t.Errorf("a bridge vpcni did not make: %v", err)
		}
		if err := Uninstall("", Settings{Bridge: "other"}); err == nil || !strings.Contains(err.Error(), "left alone") {
			t.Errorf("uninstall of a bridge vpcni did not make: %v", err)
		}
	})
}
