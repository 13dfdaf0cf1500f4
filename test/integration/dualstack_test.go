package integration

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/ebpf"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// byFamily is an ADD result's addresses, in the result's order.
func byFamily(t *testing.T, r *types100.Result) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, ip := range r.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			t.Fatalf("result address %v", ip.Address)
		}
		out = append(out, a.Unmap())
	}
	return out
}

// kernel6 is what vpcni owns for IPv6 in the node namespace: its /128
// routes and the proxy NDP entries on the uplink.
func (e *env) kernel6() (routes, proxies []netip.Addr) {
	e.T.Helper()
	h := e.node()
	rs := bedtest.Retry(e.T, func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: veth.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	})
	for _, r := range rs {
		if ones, _ := r.Dst.Mask.Size(); ones == 128 {
			a, _ := netip.AddrFromSlice(r.Dst.IP)
			routes = append(routes, a)
		}
	}
	uplink, err := h.LinkByName("eth0")
	if err != nil {
		e.T.Fatal(err)
	}
	ns := bedtest.Retry(e.T, func() ([]netlink.Neigh, error) { return h.NeighProxyList(uplink.Attrs().Index, netlink.FAMILY_V6) })
	for _, n := range ns {
		a, _ := netip.AddrFromSlice(n.IP)
		proxies = append(proxies, a)
	}
	return routes, proxies
}

// Dual-stack and IPv6-only pods on the veth mode, through the real plugin
// and agent: each pod gets an address of every family from the static
// ranges of the segment; pods reach each other, the node and a host on the
// segment in every family (the host by proxy NDP, for IPv6); CHECK passes;
// DEL takes the /128 route and the proxy NDP entry away.
func TestDualStack(t *testing.T) {
	for _, tc := range []struct {
		name string
		fams []family.Family
		ebpf bool
	}{
		{"dual-stack", []family.Family{family.V4, family.V6}, false},
		{"ipv6-only", []family.Family{family.V6}, false},
		// Mode ebpf: its programs take IPv4, IPv6 takes the routed path
		// of mode veth, and the agent says so.
		{"dual-stack-ebpf", []family.Family{family.V4, family.V6}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{bedtest.NewDualStack(t, binDir, "vpcn6", "10.79.0.0/24", "10.79.0.0/26", "fd00:79::/64")}
			if tc.ebpf {
				bedtest.MountBPFFS(t)
				pins := filepath.Join(bedtest.BPFFSDir, e.TB.Prefix)
				t.Cleanup(func() { _ = os.RemoveAll(pins) })
				e.Cfg.Datapath = config.Datapath{Mode: ebpf.Mode, Settings: &ebpf.Settings{PinPath: pins, Require: true}}
			}
			r6 := static.Range{CIDR: "fd00:79::1:0/112"}
			st := e.Cfg.Provider.Settings.(*static.Config)
			if slices.Contains(tc.fams, family.V4) {
				st.Ranges = append(st.Ranges, r6)
			} else {
				st.Ranges = []static.Range{r6}
			}
			e.Cfg.IPFamilies = tc.fams
			e.StartAgent()
			c := e.cni("1.1.0")
			p1, p2 := e.Pod(1), e.Pod(2)
			a1, a2 := byFamily(t, e.Add(c, "c1", p1)), byFamily(t, e.Add(c, "c2", p2))
			for _, got := range [][]netip.Addr{a1, a2} {
				if len(got) != len(tc.fams) {
					t.Fatalf("ADD gave %v, want one address of each of %v", got, tc.fams)
				}
				for i, f := range tc.fams {
					if family.Of(got[i]) != f {
						t.Fatalf("ADD gave %v, want %v in that order", got, tc.fams)
					}
				}
			}
			node, nbr := netnsutil.Path(e.TB.NodeNS()), netnsutil.Path(e.TB.NbrNS())
			for i, f := range tc.fams {
				nodeIP, nbrIP := e.TB.NodeIP, e.TB.NbrIP
				if f == family.V6 {
					nodeIP, nbrIP = e.TB.NodeIP6, e.TB.NbrIP6
				}
				bedtest.Echo(t, p2, a2[i])
				bedtest.Echo(t, node, nodeIP)
				bedtest.Echo(t, nbr, nbrIP)
				bedtest.Reach(t, p1, testbed.HostPort(a2[i], 7777))  // pod -> pod
				bedtest.Reach(t, p1, testbed.HostPort(nodeIP, 7777)) // pod -> node
				bedtest.Reach(t, p1, testbed.HostPort(nbrIP, 7777))  // pod -> a host on the segment
				bedtest.Reach(t, nbr, testbed.HostPort(a2[i], 7777)) // a host on the segment -> pod
				t.Logf("vpcni-test: %s: pod %s <-> pod %s, node %s, neighbour %s", f, a1[i], a2[i], nodeIP, nbrIP)
			}
			v6 := func(addrs []netip.Addr) netip.Addr {
				for _, a := range addrs {
					if family.Of(a) == family.V6 {
						return a
					}
				}
				return netip.Addr{}
			}
			routes, proxies := e.kernel6()
			for _, a := range []netip.Addr{v6(a1), v6(a2)} {
				if !slices.Contains(routes, a) || !slices.Contains(proxies, a) {
					t.Fatalf("node side of %s: /128 routes %v, proxy NDP entries %v", a, routes, proxies)
				}
			}
			if err := c.Check(bedtest.Ctx(t), testbed.Runtime("c1", p1, "eth0", nil)); err != nil {
				t.Fatalf("CHECK of a %s pod: %v", tc.name, err)
			}
			state := e.state()
			if len(tc.fams) > 1 && (len(state.Families) != 2 || state.Families[1].Family != "ipv6" || state.Families[1].Allocated != 2) {
				t.Fatalf("agent state's pools by family: %+v", state.Families)
			}
			if tc.ebpf {
				if !strings.HasPrefix(state.FastPath, "on for IPv4; IPv6 takes the routed path") {
					t.Fatalf("mode ebpf on a dual-stack node: fast path %q, want it on for IPv4 and saying IPv6 takes the routed path", state.FastPath)
				}
				t.Logf("vpcni-test: ebpf fast path: %s", state.FastPath)
			}
			if err := c.Del(bedtest.Ctx(t), testbed.Runtime("c1", p1, "eth0", nil)); err != nil {
				t.Fatal(err)
			}
			bedtest.WaitFor(t, 5*time.Second, "c1's IPv6 route and proxy entry to go", func() bool {
				routes, proxies := e.kernel6()
				return !slices.Contains(routes, v6(a1)) && !slices.Contains(proxies, v6(a1)) && slices.Contains(routes, v6(a2))
			})
		})
	}
}
