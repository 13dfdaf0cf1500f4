package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchGARP measures what vpcni's gratuitous ARP buys when a pod's address
// moves between nodes. On a two-node lab, the legacy VM pings a pod on n1
// that asked for its address by name; the pod is deleted there (the
// address goes back to the cloud at once) and added on n2 with the same
// address. The figure is the legacy VM's outage as it sees it: from the
// start of the DEL on n1 until the sending of its first probe answered from
// n2 (to within one probe interval). With the agents' gratuitous ARP on
// and with it off, --samples times each, the side that goes first
// alternating (on, off; off, on; …) so that neither always meets the lab
// fresh; each move uses an address the legacy VM has never seen before.
// The summary line gives the medians and their interquartile ranges.
//
// With --family 6 the same move is measured for IPv6 on a dual-stack lab
// (the agents' ipFamilies [ipv4, ipv6], the pod asking for an address of
// each family): the legacy VM pings the pod's IPv6 address, and the switch
// turns the agents' unsolicited neighbour advertisement on and off (the
// same datapath.veth.garp). Its summary line is ndp-move's.
func benchGARP(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench garp", flag.ContinueOnError)
	prefix := fs.String("prefix", "vpcni-garpbench", "the lab's namespace prefix")
	subnet := fs.String("subnet", "10.94.0.0/24", "the lab's subnet")
	every := fs.Duration("every", 10*time.Millisecond, "the legacy VM's probe interval")
	limit := fs.Duration("limit", 3*time.Minute, "longest wait for the legacy VM to reach the moved pod")
	samples := fs.Int("samples", 5, "moves with gratuitous ARP on and as many with it off (at most 40)")
	fam := fs.Int("family", 4, "4: the IPv4 move (garp-move); 6: the IPv6 move with unsolicited neighbour advertisements on a dual-stack lab (ndp-move)")
	subnet6 := fs.String("subnet6", "fd00:94::/64", "with --family 6: the lab's IPv6 subnet")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *samples < 1 || *samples > 40 {
		return usageError{fmt.Sprintf("--samples %d: want 1 to 40 (each move takes an address of its own from .150 up)", *samples)}
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	sn, err := netip.ParsePrefix(*subnet)
	if err != nil {
		return usageError{fmt.Sprintf("--subnet %q: %v", *subnet, err)}
	}
	var sn6 netip.Prefix
	switch *fam {
	case 4:
	case 6:
		if sn6, err = netip.ParsePrefix(*subnet6); err != nil || !sn6.Addr().Is6() {
			return usageError{fmt.Sprintf("--subnet6 %q: not an IPv6 prefix", *subnet6)}
		}
	default:
		return usageError{fmt.Sprintf("--family %d: want 4 or 6", *fam)}
	}
	name := "garp-move"
	if *fam == 6 {
		name = "ndp-move"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2**samples)*(*limit+time.Minute))
	defer cancel()
	l, err := lab.Up(ctx, lab.Config{Prefix: *prefix, Nodes: 2, Subnet: sn, Subnet6: sn6})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, l.Close()) }()
	// A fresh run dir: agents' stores from an earlier run would restore
	// pods of a lab that is gone.
	runDir := labDir(*prefix)
	_ = testbed.StopRecorded(runDir)
	if err := os.RemoveAll(runDir); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, testbed.StopRecorded(runDir), os.RemoveAll(runDir)) }()
	fmt.Fprintf(out, "%s detail: legacy VM eth0 %s\n", name, neighParams(l.Legacy.NS, *fam))
	b4 := sn.Addr().As4()
	outages := map[bool][]float64{}
	move := 0
	for i := range *samples {
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, garp := range order {
			b4[3] = byte(150 + move)
			ips := []netip.Addr{netip.AddrFrom4(b4)}
			if *fam == 6 {
				b16 := sn6.Masked().Addr().As16()
				b16[15] = byte(150 + move)
				ips = append(ips, netip.AddrFrom16(b16))
			}
			move++
			m, err := garpMove(ctx, l, bin, runDir, garp, ips, *every, *limit)
			if err != nil {
				return fmt.Errorf("move %d with garp=%v: %w", move, garp, err)
			}
			fmt.Fprintf(out, "%s detail: sample=%d garp=%v %s\n", name, i+1, garp, m)
			outages[garp] = append(outages[garp], float64(m.outage.Milliseconds()))
		}
	}
	with, without := spreadOf(outages[true]), spreadOf(outages[false])
	fmt.Fprintf(out, "%s detail: %d samples each, the first side alternating; outage median [interquartile range]: with %s ms, without %s ms\n",
		name, *samples, with.format("%.0f"), without.format("%.0f"))
	fmt.Fprintf(out, "%s: with_ms=%.0f without_ms=%.0f samples=%d with_q1_ms=%.0f with_q3_ms=%.0f without_q1_ms=%.0f without_q3_ms=%.0f\n",
		name, with.med, without.med, *samples, with.q1, with.q3, without.q1, without.q3)
	return nil
}

// moveResult is one move as the legacy VM saw it.
type moveResult struct {
	outage, del, add, afterAdd time.Duration
	neigh                      []string // the legacy VM's entry for the address over time
}

func (m moveResult) String() string {
	return fmt.Sprintf("outage_ms=%d del_ms=%d add_ms=%d after_add_ms=%d legacy_neigh=[%s]", m.outage.Milliseconds(),
		m.del.Milliseconds(), m.add.Milliseconds(), m.afterAdd.Milliseconds(), strings.Join(m.neigh, "; "))
}

// garpMove starts vpcnid on both nodes with gratuitous ARP on or off,
// moves a pod with addresses ips (an IPv4 one, and an IPv6 one on a
// dual-stack lab) from n1 to n2 under the legacy VM's pings of the last,
// and stops the agents again.
func garpMove(ctx context.Context, l *lab.Lab, bin, runDir string, garp bool, ips []netip.Addr, every, limit time.Duration) (m moveResult, err error) {
	ip := ips[len(ips)-1]
	var want []string
	for _, a := range ips {
		want = append(want, a.String())
	}
	var clis []*testbed.CNI
	for _, n := range l.Nodes {
		cfg := config.Defaults()
		cfg.NodeName = n.Name
		cfg.SocketPath = filepath.Join(runDir, n.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(runDir, n.Name, "state")
		cfg.MetricsAddr = ""
		cfg.Datapath = config.Datapath{Mode: "veth", Settings: &veth.Settings{GARP: &garp}}
		if len(ips) > 1 {
			cfg.IPFamilies = []family.Family{family.V4, family.V6}
		}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
		a, err := testbed.StartAgentIn(runDir, n.NS, bin, cfg)
		if err != nil {
			return m, fmt.Errorf("vpcnid on %s: %w", n.Name, err)
		}
		defer func() { err = errors.Join(err, a.Stop()) }()
		cli, err := testbed.NewCNIIn(n.NS, []string{bin}, filepath.Join(runDir, n.Name, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-garp", cfg.SocketPath))
		if err != nil {
			return m, err
		}
		clis = append(clis, cli)
	}
	// The pod on n1, then the same pod (same address) on n2: a fresh
	// namespace each, as a runtime gives a pod that starts elsewhere.
	var pods [2]string
	for i := range pods {
		pods[i] = fmt.Sprintf("%s-garp%d%d", l.Prefix, ips[0].As4()[3], i)
		if err := netnsutil.Add(pods[i]); err != nil {
			return m, err
		}
		defer netnsutil.Delete(pods[i])
	}
	rt := func(i int) *libcni.RuntimeConf {
		r := testbed.Runtime(fmt.Sprintf("garp-%d-%d", ips[0].As4()[3], i), netnsutil.Path(pods[i]), "eth0", nil)
		r.Args = append(r.Args, [2]string{"IP", strings.Join(want, ",")})
		return r
	}
	if _, err := clis[0].Add(ctx, rt(0)); err != nil {
		return m, fmt.Errorf("ADD %s on n1: %w", ip, err)
	}
	legacy := netnsutil.Path(l.Legacy.NS)
	p, err := lab.StartPinger(legacy, ip, every)
	if err != nil {
		return m, err
	}
	defer p.Stop()
	if err := p.WaitAnswered(5 * time.Second); err != nil {
		return m, fmt.Errorf("legacy VM -> %s on n1: %w", ip, err)
	}
	// Some traffic first, as a client that talks to the pod would have.
	time.Sleep(time.Second)
	m.neigh = append(m.neigh, "before: "+neighOf(l.Legacy.NS, ip))

	start := time.Now()
	if err := clis[0].Del(ctx, rt(0)); err != nil {
		return m, fmt.Errorf("DEL %s on n1: %w", ip, err)
	}
	_ = netnsutil.Delete(pods[0])
	deleted := time.Now()
	if _, err := clis[1].Add(ctx, rt(1)); err != nil {
		return m, fmt.Errorf("ADD %s on n2: %w", ip, err)
	}
	up := time.Now()
	m.del, m.add = deleted.Sub(start), up.Sub(deleted)
	m.neigh = append(m.neigh, "after ADD: "+neighOf(l.Legacy.NS, ip))
	// Watch the legacy VM's neighbour entry change while waiting: the
	// explanation of the figure without gratuitous ARP.
	last := ""
	for end := up.Add(limit); ; {
		// Once the DEL has returned, the pod on n1 is gone: an answer to a
		// probe sent after that comes from n2.
		if t, ok := p.FirstAnsweredAfter(deleted); ok {
			m.outage, m.afterAdd = t.Sub(start), max(t.Sub(up), 0)
			break
		}
		if time.Now().After(end) {
			return m, fmt.Errorf("legacy VM did not reach %s on n2 within %s of its ADD (neighbour entry: %s)", ip, limit, neighOf(l.Legacy.NS, ip))
		}
		if s := neighState(l.Legacy.NS, ip); s != last {
			m.neigh = append(m.neigh, fmt.Sprintf("+%dms %s", time.Since(up).Milliseconds(), s))
			last = s
		}
		time.Sleep(every)
	}
	m.neigh = append(m.neigh, "reached: "+neighOf(l.Legacy.NS, ip))
	return m, nil
}

// neighOf is the legacy VM's neighbour entry for ip ("lladdr MAC STATE").
func neighOf(ns string, ip netip.Addr) string {
	out, err := netnsutil.Output(ns, "ip", "neigh", "show", "to", ip.String())
	if err != nil {
		return "? " + err.Error()
	}
	f := strings.Fields(out)
	if len(f) > 2 {
		f = f[3:] // drop "<ip> dev eth0"
	}
	return strings.Join(f, " ")
}

// neighState is the entry's state alone (REACHABLE, STALE, DELAY, ...).
func neighState(ns string, ip netip.Addr) string {
	f := strings.Fields(neighOf(ns, ip))
	if len(f) == 0 {
		return "none"
	}
	if len(f) >= 3 && f[0] == "lladdr" {
		return f[1] + " " + f[len(f)-1]
	}
	return f[len(f)-1]
}

// neighParams are the legacy VM's neighbour timers of family fam (4 or 6)
// the figure without gratuitous ARP (or NA) comes from (the kernel's
// defaults: nothing sets them).
func neighParams(ns string, fam int) string {
	var b strings.Builder
	dir, accept := "/proc/sys/net/ipv4/", "conf/eth0/arp_accept"
	if fam == 6 {
		dir, accept = "/proc/sys/net/ipv6/", "conf/eth0/drop_unsolicited_na"
	}
	for _, f := range []string{"neigh/eth0/base_reachable_time_ms", "neigh/eth0/delay_first_probe_time", "neigh/eth0/ucast_solicit",
		"neigh/eth0/retrans_time_ms", "neigh/eth0/mcast_resolicit", "neigh/eth0/locktime", accept} {
		out, err := netnsutil.Output(ns, "cat", dir+f)
		if err != nil {
			out = "?"
		}
		fmt.Fprintf(&b, "%s=%s ", filepath.Base(f), strings.TrimSpace(out))
	}
	return strings.TrimSpace(b.String())
}
