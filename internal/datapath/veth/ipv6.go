package veth

import (
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/datapath"
)

// IPv6 pods are wired as IPv4 ones are — the node routes each address
// alone to the pod's veth and answers for it on the uplink, by proxy NDP
// instead of proxy ARP — with what IPv6 adds, each measured on Linux 6.18:
//
//   - Proxy NDP answers only with net.ipv6.conf.all.forwarding=1 and
//     proxy_ndp=1 on the uplink (or conf.all); forwarding on the uplink
//     alone, with conf.all off, does not forward. The kernel joins the
//     proxied address's solicited-node group itself, so a NIC that filters
//     multicast still hears the solicitations.
//   - The first answer waits a random part of neigh.<uplink>.proxy_delay
//     (80 = 0.8 s by default): a neighbour's first connection to a pod took
//     236-726 ms, and 2-5 ms with proxy_delay=0.
//   - Forwarding stops an interface's router advertisements unless its
//     accept_ra is 2, and turning forwarding on drops the default route
//     they gave at once: accept_ra goes to 2 first on an uplink that takes
//     them (ipv6Sysctls).
//   - A pod address without IFA_F_NODAD stays tentative, unusable, for
//     ~2 s of duplicate address detection.
//   - A new host veth's own link-local address is tentative for ~2 s, and
//     until then the kernel sends no neighbour solicitation from it: the
//     node's first answer to a new pod waited 2.05 s. The node keeps a
//     permanent neighbour entry for each pod address instead (the pod's
//     MAC is the one Setup gave it), so it never needs to ask: 0.1 ms.
//   - The kernel sends no netlink notification when a proxy entry is added
//     or deleted (v6 as v4): kwatch polls them.

// ipv6Sysctls are what IPv6 pods need on the node, in the order to write
// them, for the uplink's current accept_ra.
func ipv6Sysctls(uplink string) []datapath.Sysctl {
	ra, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + uplink + "/accept_ra")
	if err != nil {
		ra = nil // no such uplink, or IPv6 off: the first write says so
	}
	return ipv6SysctlsFor(uplink, strings.TrimSpace(string(ra)))
}

func ipv6SysctlsFor(uplink, acceptRA string) []datapath.Sysctl {
	conf := "net/ipv6/conf/" + uplink + "/"
	// all/disable_ipv6 1 turns IPv6 off on every link, the pods' host
	// veths among them, whatever the uplink's own says.
	out := []datapath.Sysctl{
		{Key: "net/ipv6/conf/all/disable_ipv6", Value: "0", Why: "IPv6 is on on the node's links, the pods' host veths among them"},
		{Key: conf + "disable_ipv6", Value: "0", Why: "the uplink carries the pods' IPv6 traffic"},
	}
	// An uplink that takes router advertisements (accept_ra 1) would stop
	// with forwarding on, and lose the default route they gave it the
	// moment forwarding goes on; 2 keeps them. One that takes none (0) is
	// configured otherwise and left so.
	if acceptRA == "1" || acceptRA == "2" {
		out = append(out, datapath.Sysctl{Key: conf + "accept_ra", Value: "2",
			Why: "the uplink keeps taking router advertisements (its default route) with IPv6 forwarding on"})
	}
	return append(out,
		datapath.Sysctl{Key: "net/ipv6/conf/all/forwarding", Value: "1", Why: "pod IPv6 traffic is forwarded by the node's stack, and proxy NDP answers only then"},
		datapath.Sysctl{Key: conf + "proxy_ndp", Value: "1", Why: "the node answers neighbour solicitations for its pods' IPv6 addresses on the uplink"},
		datapath.Sysctl{Key: "net/ipv6/neigh/" + uplink + "/proxy_delay", Value: "0", Why: "the node answers neighbour solicitations for its pods at once, not after up to 0.8 s"},
	)
}

// podNeighbour is the node's permanent neighbour entry for one of a pod's
// IPv6 addresses, on its host veth.
func podNeighbour(hostIdx int, ip netip.Addr, podMAC net.HardwareAddr) *netlink.Neigh {
	return &netlink.Neigh{LinkIndex: hostIdx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: ip.AsSlice(), HardwareAddr: podMAC}
}

// hasNeighbour says whether the node has ip's neighbour entry on linkIdx,
// permanent and at mac. One entry asked for, not a table dumped (the
// health probe asks for every pod).
func hasNeighbour(linkIdx int, ip netip.Addr, mac net.HardwareAddr) bool {
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, 0)
	req.AddData(&netlink.Ndmsg{Family: uint8(nlFamily(ip)), Index: uint32(linkIdx)})
	req.AddData(nl.NewRtAttr(unix.NDA_DST, ip.AsSlice()))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	if err != nil || len(msgs) == 0 {
		return false
	}
	n, err := netlink.NeighDeserialize(msgs[0])
	return err == nil && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == mac.String()
}
