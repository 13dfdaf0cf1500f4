package kwatch

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// Every kind of change the package is for is reported, in a namespace of
// the test's own, by the kernel's real notifications; changes to things
// vpcni did not make are not.
func TestWatch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED LOUDLY: needs root to create a network namespace")
	}
	ns := fmt.Sprintf("vpcni-kwt%d", os.Getpid())
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(ns) })
	sh := func(cmds ...string) {
		t.Helper()
		for _, c := range cmds {
			if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, strings.Fields(c)...)...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v %s", c, err, out)
			}
		}
	}
	// The uplink, a vpcni link, a link of someone else's; a vpcni route, a
	// foreign route, a NIC table route, a proxy entry, a rule, nftables.
	sh("ip link add up0 type veth peer name up0p",
		"ip link add vpcabc type veth peer name vpcabcp",
		"ip link set vpcabc alias vpcni:c1/eth0",
		"ip link add other type veth peer name otherp",
		"ip link set up0 up", "ip link set up0p up", "ip link set vpcabc up", "ip link set vpcabcp up", "ip link set other up", "ip link set otherp up",
		"ip addr add 10.9.0.10/24 dev up0",
		"ip route add 10.9.1.5/32 dev vpcabc proto 167",
		"ip route add 10.9.1.6/32 dev other",
		"ip route add default dev up0 table 28009",
		"ip neigh add proxy 10.9.0.77 dev up0",
		"ip -6 route add fd00:9:1::5/128 dev vpcabc proto 167",
		"ip -6 neigh add proxy fd00:9::77 dev up0",
		"ip rule add from 10.9.0.77 lookup 28009 pref 1536",
		"nft add table ip vpcni_kwt", "nft add chain ip vpcni_kwt c", "nft add table ip foreign_kwt",
	)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kicks := make(chan string, 64)
	err := netnsutil.Do(netnsutil.Path(ns), func() error {
		return Watch(ctx, "up0", func(what string) {
			select {
			case kicks <- what:
			default:
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	// expectAlso waits for a kick naming want; kicks naming also (a
	// consequence of the same change that may be seen first) are fine.
	expectAlso := func(change, want, also string) {
		t.Helper()
		sh(change)
		deadline := time.After(2 * time.Second)
		for {
			select {
			case got := <-kicks:
				if strings.Contains(got, want) {
					return
				}
				if also != "" && strings.Contains(got, also) {
					continue
				}
				t.Errorf("%s: unexpected kick %q (waiting for %q)", change, got, want)
			case <-deadline:
				t.Fatalf("%s: no kick naming %q within 2s", change, want)
			}
		}
	}
	expect := func(change, want string) {
		t.Helper()
		expectAlso(change, want, "")
	}
	// settle lets an entry found gone be asked about again, as it is for
	// a few polls, and then expects silence.
	settle := func(about string) {
		t.Helper()
		// Settled once no kick came for a while (a loaded machine may poll
		// late), at most 5s.
		for limit := time.After(5 * time.Second); ; {
			select {
			case got := <-kicks:
				if !strings.Contains(got, about) {
					t.Errorf("unexpected kick %q while %q settles", got, about)
				}
				continue
			case <-time.After(8 * ProxyPoll):
			case <-limit:
				t.Fatalf("kicks about %q did not stop within 5s", about)
			}
			break
		}
	}
	quiet := func(change string) {
		t.Helper()
		sh(change)
		select {
		case got := <-kicks:
			t.Errorf("%s: kicked for something vpcni did not make: %q", change, got)
		case <-time.After(300 * time.Millisecond):
		}
	}

	quiet("ip route del 10.9.1.6/32 dev other")
	quiet("ip link set other down")
	quiet("nft delete table ip foreign_kwt")
	expect("ip route del 10.9.1.5/32 dev vpcabc proto 167", "route 10.9.1.5/32")
	expect("ip route del default dev up0 table 28009", "table 28009")
	expect("ip neigh del proxy 10.9.0.77 dev up0", "proxy neighbour 10.9.0.77")
	settle("proxy neighbour 10.9.0.77")
	quiet("ip neigh add proxy 10.9.0.78 dev up0")
	// Found gone, put back (as the reconcile would) and taken again
	// before the next poll, so never seen present: still reported.
	sh("ip neigh add proxy 10.9.0.77 dev up0")
	time.Sleep(2 * ProxyPoll)
	expect("ip neigh del proxy 10.9.0.77 dev up0", "proxy neighbour 10.9.0.77")
	sh("ip neigh add proxy 10.9.0.77 dev up0", "ip neigh del proxy 10.9.0.77 dev up0")
	expect("true", "proxy neighbour 10.9.0.77")
	settle("proxy neighbour 10.9.0.77")
	// IPv6 pods' pieces: a /128 route and a proxy NDP entry.
	expect("ip -6 route del fd00:9:1::5/128 dev vpcabc proto 167", "route fd00:9:1::5/128")
	expect("ip -6 neigh del proxy fd00:9::77 dev up0", "proxy neighbour fd00:9::77")
	settle("proxy neighbour fd00:9::77")
	expect("ip rule del pref 1536", "policy rule deleted")
	expect("nft delete chain ip vpcni_kwt c", "chain in table vpcni_kwt")
	expect("nft delete table ip vpcni_kwt", "nftables table vpcni_kwt deleted")
	// A tc filter (mode ebpf's programs) and qdisc taken off a link of
	// vpcni's; another link's filter is not vpcni's business.
	tcFilter(t, ns, "vpcabc")
	tcFilter(t, ns, "other")
	quiet("tc filter del dev other ingress")
	expect("tc filter del dev vpcabc ingress", "tc filter deleted on vpcabc")
	tcFilter(t, ns, "vpcabc")
	expect("tc qdisc del dev vpcabc clsact", "deleted on vpcabc")
	settle("deleted on vpcabc")
	expect("ip link set vpcabc down", "link vpcabc down")
	// A port of vpcni's bridge taken off it.
	sh("ip link add vbr type bridge", "ip link set vbr alias vpcni:bridge", "ip link set otherp master vbr")
	expect("ip link set otherp nomaster", "link otherp master")
	expect("ip link del vpcabc", "link vpcabc deleted")
	quiet("ip link del other")
	// Last: the uplink going down also takes its proxy entries with it
	// (the poll may see that first).
	expectAlso("ip link set up0 down", "link up0 down", "proxy neighbour 10.9.0.78")
}

// tcFilter puts a tc BPF filter (a program that passes every packet) on
// the link's ingress in the namespace, as mode ebpf does.
func tcFilter(t *testing.T, ns, link string) {
	t.Helper()
	prog, err := bpf.NewProgram(&bpf.ProgramSpec{Type: bpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatalf("load a tc program: %v", err)
	}
	defer prog.Close() // the filter holds it
	err = netnsutil.Do(netnsutil.Path(ns), func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
		if err := netlink.QdiscReplace(q); err != nil {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
			Fd: prog.FD(), Name: "kwt", DirectAction: true})
	})
	if err != nil {
		t.Fatalf("tc filter on %s: %v", link, err)
	}
}
