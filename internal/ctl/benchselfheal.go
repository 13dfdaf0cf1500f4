package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
)

// healItem is one piece of a node's datapath the bench takes away: how,
// how to tell it is back, and the repair kind the agent must log for it.
type healItem struct {
	name, kind string
	take       func(b *healBed) error
	back       func(b *healBed) (bool, error)
}

// healScenario is one datapath mode on a fresh one-node testbed and the
// items taken from it.
type healScenario struct {
	mode  string
	setup func(b *healBed, cfg *config.Config) error
	items []healItem
}

// healBed is a scenario's running testbed.
type healBed struct {
	tb    *testbed.Topology
	h     *netlink.Handle // in the node namespace
	nsFd  netns.NsHandle
	cni   *testbed.CNI
	agent *testbed.Agent
	// pods[0] is on the uplink; pods[1], where there is one, on the NIC.
	pods []healPod
}

type healPod struct {
	id, ns string
	ip     netip.Addr
}

// healResult is one item's repair times, in ms, over the rounds.
type healResult struct {
	scenario, item  string
	watch, timer    []float64
	watchKindLogged bool
}

// benchSelfHeal takes each piece of vpcni's datapath away in turn — a
// pod's host route, its proxy ARP entry, its host link (down, deleted),
// a secondary NIC's rules and table, the service path's NAT table and
// routes, the bridge's hold on the uplink — while pods are added and
// deleted on the same node, and measures the time until the agent has put
// it back: first with the kernel watch, then with the periodic reconcile
// alone.
func benchSelfHeal(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench selfheal", flag.ContinueOnError)
	rounds := fs.Int("rounds", 3, "times each item is taken away, per run")
	period := fs.Duration("period", time.Second, "the agent's selfHeal.period in the run without the watch")
	churn := fs.Bool("churn", true, "add and delete pods on the node meanwhile")
	modes := fs.String("modes", "veth,macvlan,bridge", "comma-separated datapath modes")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var results []healResult
	for _, sc := range healScenarios() {
		if !slices.Contains(strings.Split(*modes, ","), sc.mode) {
			continue
		}
		r, err := runHealScenario(sc, *rounds, *period, *churn)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.mode, err)
		}
		results = append(results, r...)
	}
	fmt.Fprintf(out, "selfheal-bench: each item taken away %d times on a one-node testbed (pods churning: %v); repair time from the deletion to the item back, max over rounds; with the kernel watch (minInterval 50ms), then the timer alone (period %s); load average %s\n", *rounds, *churn, *period, loadAvg())
	fmt.Fprintf(out, "%-9s %-16s %10s %10s %s\n", "mode", "item", "watch ms", "timer ms", "logged")
	var maxWatch, maxTimer float64
	for _, r := range results {
		w, t := slicesMax(r.watch), slicesMax(r.timer)
		maxWatch, maxTimer = max(maxWatch, w), max(maxTimer, t)
		fmt.Fprintf(out, "%-9s %-16s %10.1f %10.1f %v\n", r.scenario, r.item, w, t, r.watchKindLogged)
	}
	fmt.Fprintf(out, "selfheal: items=%d max_repair_ms=%.1f timer_max_repair_ms=%.1f period_ms=%d\n", len(results), maxWatch, maxTimer, period.Milliseconds())
	return nil
}

func slicesMax(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// runHealScenario brings up the testbed, measures every item with the
// watch, restarts the agent without it (pods stay) and measures again.
func runHealScenario(sc healScenario, rounds int, period time.Duration, churn bool) (res []healResult, err error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	b := &healBed{tb: testbed.New("vpcni-heal", netip.MustParsePrefix("10.81.0.0/24"))}
	if err := b.tb.Up(); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.tb.Down()) }()
	if b.nsFd, err = netns.GetFromName(b.tb.NodeNS()); err != nil {
		return nil, err
	}
	defer b.nsFd.Close()
	if b.h, err = netlink.NewHandleAt(b.nsFd); err != nil {
		return nil, err
	}
	defer b.h.Close()

	cfg := b.tb.AgentConfig(b.tb.RunDir, "10.81.0.0/24", "10.81.0.0/26")
	cfg.MetricsAddr = ""
	cfg.Pool.WarmTarget, cfg.Pool.BatchSize, cfg.Pool.MaxFree = 4, 4, 16
	cfg.Datapath = config.Datapath{Mode: sc.mode}
	if sc.setup != nil {
		if err := sc.setup(b, &cfg); err != nil {
			return nil, err
		}
	}
	watchOn, watchOff := true, false
	cfg.SelfHeal.Watch = &watchOn
	if b.agent, err = b.tb.StartAgent(bin, cfg); err != nil {
		return nil, err
	}
	if b.cni, err = b.tb.NewCNI([]string{bin}, filepath.Join(b.tb.RunDir, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-heal", cfg.SocketPath)); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := b.addPods(ctx, sc); err != nil {
		return nil, err
	}
	for _, it := range sc.items {
		res = append(res, healResult{scenario: sc.mode, item: it.name})
	}
	measure := func(timer bool) error {
		stop := b.churn(ctx, churn)
		defer func() { err = errors.Join(err, stop()) }()
		for i, it := range sc.items {
			for range rounds {
				logged := b.logCount(it.kind)
				d, err := b.measure(it, 15*time.Second)
				if err != nil {
					return fmt.Errorf("%s: %w", it.name, err)
				}
				if timer {
					res[i].timer = append(res[i].timer, d)
					continue
				}
				res[i].watch = append(res[i].watch, d)
				// The log line is written after the repair: give it a moment.
				for end := time.Now().Add(time.Second); b.logCount(it.kind) <= logged && time.Now().Before(end); {
					time.Sleep(5 * time.Millisecond)
				}
				res[i].watchKindLogged = b.logCount(it.kind) > logged
			}
		}
		return nil
	}
	if err := measure(false); err != nil {
		return nil, fmt.Errorf("with the watch: %w\n%s", err, b.logTail(20))
	}
	if err := b.agent.Stop(); err != nil {
		return nil, err
	}
	cfg.SelfHeal.Watch, cfg.SelfHeal.Period.Duration = &watchOff, period
	if b.agent, err = b.tb.StartAgent(bin, cfg); err != nil {
		return nil, err
	}
	if err := measure(true); err != nil {
		return nil, fmt.Errorf("timer alone: %w\n%s", err, b.logTail(20))
	}
	// Whatever was taken and put back, the pod still answers.
	if err := netnsutil.Probe(ctx, netnsutil.Path(b.tb.NbrNS()), testbed.HostPort(b.pods[0].ip, 9)); err != nil && !strings.Contains(err.Error(), "refused") {
		return nil, fmt.Errorf("neighbour -> pod %s after the repairs: %w", b.pods[0].ip, err)
	}
	return res, nil
}

// addPods adds the scenario's pods: one on the uplink, and for a scenario
// with a NIC range one on the NIC too.
func (b *healBed) addPods(ctx context.Context, sc healScenario) error {
	wantNIC := sc.mode == "veth"
	for i := range 12 {
		ns := fmt.Sprintf("%s-hp%d", b.tb.Prefix, i)
		if err := netnsutil.Add(ns); err != nil {
			return err
		}
		id := fmt.Sprintf("heal-%d", i)
		r, err := b.cni.Add(ctx, testbed.Runtime(id, netnsutil.Path(ns), "eth0", nil))
		if err != nil {
			return fmt.Errorf("ADD: %w", err)
		}
		cr, err := types100.GetResult(r)
		if err != nil {
			return err
		}
		ip, _ := netip.AddrFromSlice(cr.IPs[0].Address.IP.To4())
		p := healPod{id: id, ns: ns, ip: ip}
		onNIC := ip.As4()[3] >= 128
		switch {
		case len(b.pods) == 0 && !onNIC:
			b.pods = append(b.pods, p)
		case len(b.pods) == 1 && onNIC && wantNIC:
			b.pods = append(b.pods, p)
		}
		if len(b.pods) == 1 && !wantNIC || len(b.pods) == 2 {
			return nil
		}
	}
	return fmt.Errorf("no pod landed where the scenario needs one (got %v)", b.pods)
}

// churn adds and deletes pods on the node until stopped: the load the
// repairs happen under.
func (b *healBed) churn(ctx context.Context, on bool) (stop func() error) {
	if !on {
		return func() error { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var cycles atomic.Int64
	var errMu sync.Mutex
	var firstErr error
	for w := range 2 {
		ns := fmt.Sprintf("%s-churn%d", b.tb.Prefix, w)
		if err := netnsutil.Add(ns); err != nil {
			cancel()
			return func() error { return err }
		}
		wg.Go(func() {
			defer netnsutil.Delete(ns)
			for i := 0; ctx.Err() == nil; i++ {
				rt := testbed.Runtime(fmt.Sprintf("churn-%d-%d", w, i), netnsutil.Path(ns), "eth0", nil)
				_, err := b.cni.Add(ctx, rt)
				if err == nil {
					err = b.cni.Del(context.Background(), rt)
				}
				if err != nil && ctx.Err() == nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("churn: %w", err)
					}
					errMu.Unlock()
				}
				cycles.Add(1)
			}
		})
	}
	return func() error {
		cancel()
		wg.Wait()
		if cycles.Load() == 0 {
			return errors.Join(firstErr, errors.New("churn: no pod was added and deleted"))
		}
		return firstErr
	}
}

// measure takes the item away and polls every millisecond until it is
// back.
func (b *healBed) measure(it healItem, limit time.Duration) (float64, error) {
	if ok, err := b.waitBack(it, 20*time.Second); err != nil || !ok {
		return 0, fmt.Errorf("not in place before it was taken: %v", err)
	}
	if err := it.take(b); err != nil {
		return 0, fmt.Errorf("take: %w", err)
	}
	start := time.Now()
	ok, err := b.waitBack(it, limit)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("not repaired within %s", limit)
	}
	return float64(time.Since(start).Microseconds()) / 1000, nil
}

func (b *healBed) waitBack(it healItem, limit time.Duration) (bool, error) {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(time.Millisecond) {
		ok, err := it.back(b)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false, err
		}
		if ok {
			return true, nil
		}
	}
	return false, nil
}

// logCount is how many repairs of the kind the agent has logged.
func (b *healBed) logCount(kind string) int {
	data, err := os.ReadFile(b.agent.LogPath)
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, `msg="datapath repaired"`) && strings.Contains(l, "kind="+kind+" ") {
			n++
		}
	}
	return n
}

// logTail is the agent's last n log lines above debug, for an error.
func (b *healBed) logTail(n int) string {
	data, _ := os.ReadFile(b.agent.LogPath)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if !strings.Contains(l, "level=DEBUG") {
			lines = append(lines, l)
		}
	}
	return "agent log:\n" + strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (b *healBed) link(name string) (netlink.Link, error) { return b.h.LinkByName(name) }

func hostNet(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

// routeTo finds a /32 route of vpcni's to ip through link name.
func (b *healBed) routeTo(ip netip.Addr, name string) (*netlink.Route, error) {
	l, err := b.link(name)
	if err != nil {
		return nil, err
	}
	rs, err := b.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: hostNet(ip), LinkIndex: l.Attrs().Index, Protocol: veth.RouteProtocol},
		netlink.RT_FILTER_DST|netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	return &rs[0], nil
}

func (b *healBed) proxied(ip netip.Addr, dev string) (bool, error) {
	l, err := b.link(dev)
	if err != nil {
		return false, err
	}
	ns, err := b.h.NeighProxyList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return false, err
	}
	for _, n := range ns {
		if n.IP.Equal(ip.AsSlice()) {
			return true, nil
		}
	}
	return false, nil
}

func (b *healBed) rule(prio int, src netip.Addr) (*netlink.Rule, error) {
	rules, err := b.h.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		if r.Priority != prio {
			continue
		}
		if src.IsValid() && (r.Src == nil || !r.Src.IP.Equal(src.AsSlice())) {
			continue
		}
		return &r, nil
	}
	return nil, nil
}

// nicTableDefault is the default route in the NIC's table.
func (b *healBed) nicTableDefault() (*netlink.Route, error) {
	l, err := b.link("eth1")
	if err != nil {
		return nil, err
	}
	rs, err := b.h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 28000 + l.Attrs().Index}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			return &r, nil
		}
	}
	return nil, nil
}

// Items. The NIC's address and MAC are those of the scenario's static
// range (healNIC*).
const (
	healNICMAC  = "02:aa:bb:00:00:21"
	healNICAddr = "10.81.0.11"
)

func healScenarios() []healScenario {
	hostVeth := func(p healPod) string { return veth.HostIfName(p.id, "eth0") }
	svcVeth := func(p healPod) string { return svcpath.HostIfName(p.id, "eth0") }
	routeItem := func(name string, dev func(healPod) string) healItem {
		return healItem{name: name, kind: "route",
			take: func(b *healBed) error {
				r, err := b.routeTo(b.pods[0].ip, dev(b.pods[0]))
				if err != nil || r == nil {
					return fmt.Errorf("no route to take: %v", err)
				}
				return b.h.RouteDel(r)
			},
			back: func(b *healBed) (bool, error) {
				r, err := b.routeTo(b.pods[0].ip, dev(b.pods[0]))
				return r != nil, err
			},
		}
	}
	linkDown := func(name string, dev func(healPod) string) healItem {
		return healItem{name: name, kind: "link",
			take: func(b *healBed) error {
				l, err := b.link(dev(b.pods[0]))
				if err != nil {
					return err
				}
				return b.h.LinkSetDown(l)
			},
			// Down took the route with it: both must be back.
			back: func(b *healBed) (bool, error) {
				l, err := b.link(dev(b.pods[0]))
				if err != nil || l.Attrs().Flags&net.FlagUp == 0 {
					return false, nil
				}
				r, err := b.routeTo(b.pods[0].ip, dev(b.pods[0]))
				return r != nil, err
			},
		}
	}
	vethItems := []healItem{
		routeItem("host-route", hostVeth),
		{name: "proxy-arp", kind: "neighbour",
			take: func(b *healBed) error {
				l, err := b.link("eth0")
				if err != nil {
					return err
				}
				return b.h.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, Flags: netlink.NTF_PROXY, IP: b.pods[0].ip.AsSlice()})
			},
			back: func(b *healBed) (bool, error) { return b.proxied(b.pods[0].ip, "eth0") },
		},
		linkDown("host-link-down", hostVeth),
		{name: "nic-rule-from", kind: "rule",
			take: func(b *healBed) error {
				r, err := b.rule(1536, b.pods[1].ip)
				if err != nil || r == nil {
					return fmt.Errorf("no rule to take: %v", err)
				}
				return b.h.RuleDel(r)
			},
			back: func(b *healBed) (bool, error) { r, err := b.rule(1536, b.pods[1].ip); return r != nil, err },
		},
		{name: "nic-rule-local", kind: "rule",
			take: func(b *healBed) error {
				r, err := b.rule(512, netip.Addr{})
				if err != nil || r == nil {
					return fmt.Errorf("no rule to take: %v", err)
				}
				return b.h.RuleDel(r)
			},
			back: func(b *healBed) (bool, error) { r, err := b.rule(512, netip.Addr{}); return r != nil, err },
		},
		{name: "nic-table", kind: "route",
			take: func(b *healBed) error {
				r, err := b.nicTableDefault()
				if err != nil || r == nil {
					return fmt.Errorf("no NIC table route to take: %v", err)
				}
				return b.h.RouteDel(r)
			},
			back: func(b *healBed) (bool, error) { r, err := b.nicTableDefault(); return r != nil, err },
		},
		{name: "nic-proxy-arp", kind: "neighbour",
			take: func(b *healBed) error {
				l, err := b.link("eth1")
				if err != nil {
					return err
				}
				return b.h.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, Flags: netlink.NTF_PROXY, IP: b.pods[1].ip.AsSlice()})
			},
			back: func(b *healBed) (bool, error) { return b.proxied(b.pods[1].ip, "eth1") },
		},
		// Last: the pod is re-wired from inside its namespace.
		{name: "host-veth-gone", kind: "rewired",
			take: func(b *healBed) error {
				l, err := b.link(hostVeth(b.pods[0]))
				if err != nil {
					return err
				}
				return b.h.LinkDel(l)
			},
			back: func(b *healBed) (bool, error) {
				r, err := b.routeTo(b.pods[0].ip, hostVeth(b.pods[0]))
				if err != nil || r == nil {
					return false, nil
				}
				return b.proxied(b.pods[0].ip, "eth0")
			},
		},
	}
	natTable := func(b *healBed) (bool, error) {
		c, err := nftables.New(nftables.WithNetNSFd(int(b.nsFd)))
		if err != nil {
			return false, err
		}
		t, err := c.ListTableOfFamily(svcpath.NATTable, nftables.TableFamilyIPv4)
		if err != nil || t == nil {
			return false, nil
		}
		chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
		return err == nil && len(chains) > 0, nil
	}
	return []healScenario{
		{mode: "veth", items: vethItems, setup: func(b *healBed, cfg *config.Config) error {
			// A second NIC from the segment, down and bare as hot-plugged,
			// with the upper half of the range on it.
			mac, _ := net.ParseMAC(healNICMAC)
			if err := netnsutil.VethBetween(b.tb.SegNS(), "node1", b.tb.NodeNS(), "eth1", mac); err != nil {
				return err
			}
			for _, c := range [][]string{{"ip", "link", "set", "node1", "master", "br0"}, {"ip", "link", "set", "node1", "up"}} {
				if err := netnsutil.Exec(b.tb.SegNS(), c...); err != nil {
					return err
				}
			}
			gw := b.tb.Gateway.String()
			cfg.Provider.Settings = &static.Config{Ranges: []static.Range{
				// One address on the uplink (.64): the pool takes ranges in
				// order, so every other pod lands on the NIC.
				{CIDR: "10.81.0.0/24", Gateway: gw, Exclude: []string{"10.81.0.0/26", "10.81.0.65/32", "10.81.0.66/31", "10.81.0.68/30", "10.81.0.72/29", "10.81.0.80/28", "10.81.0.96/27", "10.81.0.128/25"}},
				{CIDR: "10.81.0.0/24", Gateway: gw, Exclude: []string{"10.81.0.0/25"}, NIC: &static.NIC{MAC: healNICMAC, Address: healNICAddr}},
			}}
			return nil
		}},
		{mode: "macvlan", items: []healItem{
			{name: "nat-table", kind: "nat",
				take: func(b *healBed) error {
					c, err := nftables.New(nftables.WithNetNSFd(int(b.nsFd)))
					if err != nil {
						return err
					}
					c.DelTable(&nftables.Table{Name: svcpath.NATTable, Family: nftables.TableFamilyIPv4})
					return c.Flush()
				},
				back: natTable,
			},
			routeItem("svc-route", svcVeth),
			linkDown("svc-link-down", svcVeth),
		}},
		{mode: "bridge", items: []healItem{
			{name: "bridge-port", kind: "node",
				take: func(b *healBed) error {
					l, err := b.link("eth0")
					if err != nil {
						return err
					}
					return b.h.LinkSetNoMaster(l)
				},
				back: func(b *healBed) (bool, error) {
					br, err := b.link("vpcbr0")
					if err != nil {
						return false, nil
					}
					l, err := b.link("eth0")
					if err != nil {
						return false, err
					}
					return l.Attrs().MasterIndex == br.Attrs().Index && br.Attrs().Flags&net.FlagUp != 0, nil
				},
			},
		}},
	}
}
