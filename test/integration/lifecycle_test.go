package integration

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestLifecycle: ADD wires the pod as documented, CHECK passes, the pod
// talks to its neighbour by its own IP both ways, DEL removes exactly what
// ADD made, and DEL again is fine — for every CNI spec version.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := e.cni(v)
			podNS := e.Pod(1)
			id := "life-" + v
			res, err := c.Add(bedtest.Ctx(t), testbed.Runtime(id, podNS, "eth0", nil))
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Errorf("result version %s, want %s", res.Version(), v)
			}
			ip := bedtest.ResultIP(t, res)
			if !netip.MustParsePrefix("10.78.0.64/26").Contains(ip) && !netip.MustParsePrefix("10.78.0.128/25").Contains(ip) {
				t.Fatalf("address %s is outside the pool", ip)
			}

			// The pod's side.
			pod := bedtest.HandleIn(t, podNS)
			eth0, err := pod.LinkByName("eth0")
			if err != nil {
				t.Fatalf("pod eth0: %v", err)
			}
			addrs, _ := pod.AddrList(eth0, netlink.FAMILY_V4)
			if len(addrs) != 1 || addrs[0].IPNet.String() != ip.String()+"/32" {
				t.Errorf("pod addresses %v, want %s/32", addrs, ip)
			}
			routes, _ := pod.RouteList(eth0, netlink.FAMILY_V4)
			var haveDefault, haveGw bool
			for _, r := range routes {
				haveDefault = haveDefault || (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == "169.254.1.1"
				haveGw = haveGw || r.Dst != nil && r.Dst.String() == "169.254.1.1/32" && r.Scope == netlink.SCOPE_LINK
			}
			if !haveDefault || !haveGw {
				t.Errorf("pod routes %v: want default via 169.254.1.1 and 169.254.1.1 scope link", routes)
			}
			neighs, _ := pod.NeighList(eth0.Attrs().Index, netlink.FAMILY_V4)
			hostIf := veth.HostIfName(id, "eth0")
			host, err := e.node().LinkByName(hostIf)
			if err != nil {
				t.Fatalf("host veth %s: %v", hostIf, err)
			}
			perm := slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
				return n.IP.String() == "169.254.1.1" && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == host.Attrs().HardwareAddr.String()
			})
			if !perm {
				t.Errorf("pod neighbours %v: want 169.254.1.1 permanent -> %s", neighs, host.Attrs().HardwareAddr)
			}

			// The node's side.
			ks := e.kernel()
			if !slices.Equal(ks.Links, []string{hostIf}) || !slices.Equal(ks.Routes, []netip.Addr{ip}) || !slices.Equal(ks.Proxies, []netip.Addr{ip}) {
				t.Errorf("node state %+v, want link %s, route and proxy entry for %s", ks, hostIf, ip)
			}
			st := e.state()
			if len(st.Allocations) != 1 || st.Allocations[0].Address != ip || st.Allocations[0].PodName != id {
				t.Errorf("agent allocations %+v", st.Allocations)
			}

			if err := c.Check(bedtest.Ctx(t), testbed.Runtime(id, podNS, "eth0", nil)); err != nil {
				t.Errorf("CHECK: %v", err)
			}

			// The point of vpcni: a host on the segment reaches the pod by
			// its IP (the node answers ARP for it), and the pod the host.
			nbr := netnsutil.Path(e.TB.NbrNS())
			bedtest.Echo(t, podNS, ip)
			bedtest.Echo(t, nbr, e.TB.NbrIP)
			bedtest.Reach(t, nbr, testbed.HostPort(ip, 7777))
			bedtest.Reach(t, podNS, testbed.HostPort(e.TB.NbrIP, 7777))
			bedtest.Echo(t, netnsutil.Path(e.TB.NodeNS()), e.TB.NodeIP)
			bedtest.Reach(t, podNS, testbed.HostPort(e.TB.NodeIP, 7777))

			// DEL removes exactly what ADD made; DEL again is fine.
			rt := testbed.Runtime(id, podNS, "eth0", nil)
			if err := c.Del(bedtest.Ctx(t), rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if st := e.state(); len(st.Allocations) != 0 || st.Pool.Allocated != 0 {
				t.Errorf("after DEL the agent still has %+v (pool %+v)", st.Allocations, st.Pool)
			}
			e.waitClean()
			if err := bedtest.NoLink(pod, "eth0"); err != nil {
				t.Errorf("pod eth0 after DEL: %v", err)
			}
			if err := bedtest.ProbeWithin(nbr, testbed.HostPort(ip, 7777), 500*time.Millisecond); err == nil {
				t.Errorf("pod address %s still answers after DEL", ip)
			}
			if err := c.Del(bedtest.Ctx(t), rt); err != nil {
				t.Errorf("second DEL: %v", err)
			}
			if err := c.Check(bedtest.Ctx(t), rt); err == nil {
				t.Errorf("CHECK after DEL succeeded")
			}
			if err := netnsutil.Delete(e.TB.PodNS(1)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRepeatedAddDel: ADD for an attachment that exists returns the same
// address; ADD/DEL cycles leave nothing behind; DEL of a container vpcni
// never saw succeeds.
func TestRepeatedAddDel(t *testing.T) {
	t.Parallel()
	e := newEnv(t, withoutSelfHeal())
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			c := e.cni(v)
			podNS := e.Pod(2)
			defer netnsutil.Delete(e.TB.PodNS(2))
			rt := testbed.Runtime("rep-"+v, podNS, "eth0", nil)
			first := e.AddIP(c, "rep-"+v, podNS)
			again := e.AddIP(c, "rep-"+v, podNS)
			if first != again {
				t.Errorf("repeated ADD gave %s, then %s", first, again)
			}
			if n := len(e.state().Allocations); n != 1 {
				t.Errorf("%d allocations after repeated ADD, want 1", n)
			}
			// ADD repairs what someone broke by hand.
			if err := e.node().RouteDel(&netlink.Route{Dst: netlink.NewIPNet(first.AsSlice()), LinkIndex: mustLink(t, e, veth.HostIfName("rep-"+v, "eth0")), Protocol: veth.RouteProtocol, Scope: netlink.SCOPE_LINK}); err != nil {
				t.Fatalf("delete route by hand: %v", err)
			}
			if err := c.Check(bedtest.Ctx(t), rt); err == nil {
				t.Errorf("CHECK passed with the pod's route missing")
			}
			if ip := e.AddIP(c, "rep-"+v, podNS); ip != first {
				t.Errorf("ADD after damage gave %s, want %s", ip, first)
			}
			if err := c.Check(bedtest.Ctx(t), rt); err != nil {
				t.Errorf("CHECK after repairing ADD: %v", err)
			}
			for range 3 {
				if err := c.Del(bedtest.Ctx(t), rt); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				e.waitClean()
				e.AddIP(c, "rep-"+v, podNS)
			}
			if err := c.Del(bedtest.Ctx(t), rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			// A runtime that reuses the namespace at once for another
			// container finds it empty, though vpcni deletes links in the
			// background.
			next := testbed.Runtime("next-"+v, podNS, "eth0", nil)
			if _, err := c.Add(bedtest.Ctx(t), next); err != nil {
				t.Fatalf("ADD into the namespace just released: %v", err)
			}
			if err := c.Del(bedtest.Ctx(t), next); err != nil {
				t.Fatal(err)
			}
			if err := c.Del(bedtest.Ctx(t), testbed.Runtime("never-seen-"+v, podNS, "eth0", nil)); err != nil {
				t.Errorf("DEL of an unknown container: %v", err)
			}
			e.waitClean()
			if st := e.state(); st.Pool.Allocated != 0 {
				t.Errorf("pool %+v after all DELs", st.Pool)
			}
		})
	}
}

func mustLink(t *testing.T, e *env, name string) int {
	t.Helper()
	l, err := e.node().LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l.Attrs().Index
}

// TestConcurrentAdds: 50 ADDs at once get 50 distinct addresses, all wired;
// 50 DELs at once give them all back.
func TestConcurrentAdds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cni("1.0.0")
	const n = 50
	paths := make([]string, n)
	for i := range n {
		paths[i] = e.Pod(100 + i)
	}
	ips := make([]netip.Addr, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := c.Add(bedtest.Ctx(t), testbed.Runtime(fmt.Sprintf("burst-%d", i), paths[i], "eth0", nil))
			if err != nil {
				errs[i] = err
				return
			}
			ips[i] = bedtest.ResultIP(t, res)
		})
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("ADD %d: %v", i, errs[i])
		}
		if j, dup := seen[ips[i]]; dup {
			t.Fatalf("pods %d and %d both got %s", j, i, ips[i])
		}
		seen[ips[i]] = i
	}
	st := e.state()
	if len(st.Allocations) != n || st.Pool.Allocated != n {
		t.Fatalf("agent holds %d records, pool %+v; want %d", len(st.Allocations), st.Pool, n)
	}
	if ks := e.kernel(); len(ks.Links) != n || len(ks.Routes) != n || len(ks.Proxies) != n {
		t.Fatalf("node has %d links, %d routes, %d proxy entries; want %d each", len(ks.Links), len(ks.Routes), len(ks.Proxies), n)
	}
	// Every pod is reachable from the neighbour by its own address.
	nbr := netnsutil.Path(e.TB.NbrNS())
	for i := range n {
		bedtest.Echo(t, paths[i], ips[i])
		bedtest.Reach(t, nbr, testbed.HostPort(ips[i], 7777))
	}
	for i := range n {
		wg.Go(func() {
			errs[i] = c.Del(bedtest.Ctx(t), testbed.Runtime(fmt.Sprintf("burst-%d", i), paths[i], "eth0", nil))
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("DEL %d: %v", i, errs[i])
		}
	}
	e.waitClean()
	if st := e.state(); st.Pool.Allocated != 0 || len(st.Allocations) != 0 {
		t.Errorf("after DELs: pool %+v, %d records", st.Pool, len(st.Allocations))
	}
}

// TestAgentRestart: pods keep their connectivity while the agent is down
// (killed, as in a crash) and the restarted agent keeps their records, so
// CHECK and DEL work after it.
func TestAgentRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cni("1.0.0")
	podNS := e.Pod(1)
	ip := e.AddIP(c, "restart", podNS)
	nbr := netnsutil.Path(e.TB.NbrNS())
	bedtest.Echo(t, podNS, ip)
	bedtest.Reach(t, nbr, testbed.HostPort(ip, 7777))

	for _, how := range []string{"kill", "term"} {
		var err error
		if how == "kill" {
			err = e.Agent.Kill()
		} else {
			err = e.Agent.Stop()
		}
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		bedtest.Reach(t, nbr, testbed.HostPort(ip, 7777))
		if _, err := c.Add(bedtest.Ctx(t), testbed.Runtime("while-down", e.Pod(2), "eth0", nil)); err == nil {
			t.Fatalf("ADD succeeded with the agent down")
		} else if !bedtest.IsCode(err, 11) {
			t.Errorf("ADD with the agent down: %v, want CNI error 11", err)
		}
		e.StartAgent()
		st := e.state()
		if len(st.Allocations) != 1 || st.Allocations[0].Address != ip {
			t.Fatalf("after %s and restart the agent has %+v, want the pod's %s", how, st.Allocations, ip)
		}
		if err := c.Check(bedtest.Ctx(t), testbed.Runtime("restart", podNS, "eth0", nil)); err != nil {
			t.Errorf("CHECK after %s: %v", how, err)
		}
		bedtest.Reach(t, nbr, testbed.HostPort(ip, 7777))
		// The restarted agent does not hand the pod's address to another.
		other := e.AddIP(c, "after-"+how, e.Pod(3))
		if other == ip {
			t.Fatalf("restarted agent gave %s to a second pod", ip)
		}
		if err := c.Del(bedtest.Ctx(t), testbed.Runtime("after-"+how, e.TB.PodNS(3), "eth0", nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Del(bedtest.Ctx(t), testbed.Runtime("restart", podNS, "eth0", nil)); err != nil {
		t.Fatalf("DEL after restarts: %v", err)
	}
	e.waitClean()
}

// TestRestartRepairsAndCleans: a pod whose wiring vanished while the agent
// was down is re-wired at start; a pod whose route and proxy ARP entry
// were deleted gets them back from the node reconcile (its veth stays);
// a vpcni link without a record (a crash between the kernel and the
// store) is removed with its proxy entry, and so is a bare veth pair an
// ADD killed before it marked the pair left (its pod end with it); a proxy entry of a free address
// goes once the provider says the node holds it.
func TestRestartRepairsAndCleans(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cni("1.0.0")
	podNS, routeNS := e.Pod(1), e.Pod(3)
	ip := e.AddIP(c, "repair", podNS)
	routeIP := e.AddIP(c, "noroute", routeNS)
	st := e.state()
	if len(st.Pool.Addresses["free"]) == 0 {
		t.Fatalf("no free address in the pool to leave stale state for: %+v", st.Pool)
	}
	idle := netip.MustParseAddr(st.Pool.Addresses["free"][len(st.Pool.Addresses["free"])-1])
	if err := e.Agent.Kill(); err != nil {
		t.Fatal(err)
	}
	h := e.node()
	// Damage: the pod's host veth is gone (and its pod end with it).
	if err := h.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth.HostIfName("repair", "eth0")}}); err != nil {
		t.Fatal(err)
	}
	// Damage: another pod's route and proxy entry deleted by hand.
	routeLink := mustLink(t, e, veth.HostIfName("noroute", "eth0"))
	if err := h.RouteDel(&netlink.Route{Dst: netlink.NewIPNet(routeIP.AsSlice()), LinkIndex: routeLink, Protocol: veth.RouteProtocol, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	uplink := mustLink(t, e, "eth0")
	if err := h.NeighDel(&netlink.Neigh{LinkIndex: uplink, Family: netlink.FAMILY_V4, Flags: netlink.NTF_PROXY, IP: routeIP.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	// Stale: a proxy entry for a free address (a crash between a DEL's
	// steps).
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: uplink, Family: netlink.FAMILY_V4, Flags: netlink.NTF_PROXY, IP: idle.AsSlice()}); err != nil {
		t.Fatal(err)
	}
	// An orphan: a vpcni-made link no record knows.
	orphanNS := e.Pod(2)
	dp := netnsutil.Do(netnsutil.Path(e.TB.NodeNS()), func() error {
		v, err := veth.NewVeth("eth0", 0, false)
		if err != nil {
			return err
		}
		defer v.Close()
		_, err = v.Setup(bedtest.Ctx(t), &alloc.Allocation{ContainerID: "orphan", IfName: "eth0", Netns: orphanNS, Lease: alloc.Lease{Address: netip.MustParseAddr("10.78.0.250")}})
		return err
	})
	if dp != nil {
		t.Fatalf("make orphan: %v", dp)
	}
	// A bare pair: an ADD killed between creating the veth and marking it
	// (its pod end would block the pod's next container).
	bareNS := e.Pod(4)
	bareFd, err := netns.GetFromPath(bareNS)
	if err != nil {
		t.Fatal(err)
	}
	defer bareFd.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth.HostIfName("bare", "eth0")}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(bareFd))}); err != nil {
		t.Fatal(err)
	}
	e.StartAgent()
	want := []string{veth.HostIfName("noroute", "eth0"), veth.HostIfName("repair", "eth0")}
	slices.Sort(want)
	wantIPs := []netip.Addr{ip, routeIP}
	slices.SortFunc(wantIPs, netip.Addr.Compare)
	bedtest.WaitFor(t, 5*time.Second, "repair and orphan removal", func() bool {
		ks := e.kernel()
		slices.Sort(ks.Links)
		slices.SortFunc(ks.Proxies, netip.Addr.Compare)
		slices.SortFunc(ks.Routes, netip.Addr.Compare)
		return slices.Equal(ks.Links, want) && slices.Equal(ks.Proxies, wantIPs) && slices.Equal(ks.Routes, wantIPs)
	})
	// The node reconcile put the route back without touching the veth.
	if got := mustLink(t, e, veth.HostIfName("noroute", "eth0")); got != routeLink {
		t.Errorf("the pod whose route was deleted got a new veth (index %d, was %d): it should only get its route back", got, routeLink)
	}
	for id, ns := range map[string]string{"repair": podNS, "noroute": routeNS} {
		if err := c.Check(bedtest.Ctx(t), testbed.Runtime(id, ns, "eth0", nil)); err != nil {
			t.Errorf("CHECK of %s after repair: %v", id, err)
		}
	}
	bedtest.Echo(t, podNS, ip)
	bedtest.Echo(t, routeNS, routeIP)
	bedtest.Reach(t, netnsutil.Path(e.TB.NbrNS()), testbed.HostPort(ip, 7777))
	bedtest.Reach(t, netnsutil.Path(e.TB.NbrNS()), testbed.HostPort(routeIP, 7777))
	// The bare pair went with its pod end: the pod's next container
	// gets eth0.
	e.AddIP(c, "after-bare", bareNS)
}
