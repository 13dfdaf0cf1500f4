package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/lab/imds"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// An AWS-style lab (Config.Cloud "aws"): the same namespaces, served by the
// lab's EC2-compatible endpoint instead of Neutron. Every host is an EC2
// instance whose eth0 is its primary ENI; an ENI attached later is
// hot-plugged into its node as the hypervisor does it — a link named
// eth<device index> with the ENI's MAC, down and without addresses — and
// unplugged on detach. The VPC bridge enforces each ENI's source/destination
// check: a frame from an ENI must carry its MAC and, while the check is on,
// one of its addresses (or an address in one of its prefixes); a packet to
// an ENI must be for one of them. A pod's reply that leaves by the wrong ENI
// is dropped, as on EC2. Each node reaches the endpoint on its own loopback
// and its instance metadata (IMDSv2) at 127.0.0.1:IMDSPort, which serves
// that node's instance only, with its role's credentials.
//
// With Config.Subnet6 the VPC holds an IPv6 block (the /56 around it) and
// the subnet that /64: every instance's primary ENI gets the address of
// its IPv4 address's last byte, the router ::1. The check covers IPv6 as
// EC2's does: from an ENI only one of its IPv6 addresses or /80s (or its
// link-local address, for neighbour discovery; the unspecified address
// for duplicate address detection and listener reports), never a router
// advertisement; to an ENI only its addresses, /80s, link-local and
// multicast — so, as for IPv4, an address is delivered only to the ENI
// that holds it, the node answering neighbour solicitations for its pods.

// IMDSPort is where a node of an AWS lab reaches its instance metadata.
const IMDSPort = 9698

// InstanceType is the lab nodes' EC2 instance type: 3 ENIs of 6 addresses
// each, so a test reaches the second ENI after five pods.
const InstanceType = "t3.medium"

// NodeRole is the instance profile role the lab's nodes run with.
const NodeRole = "vpcni-node"

// awsLab is the AWS side of a lab.
type awsLab struct {
	mu      sync.Mutex // the fabric's state below
	enis    map[string]*Host
	applied []ec2api.ENI
}

func upAWS(ctx context.Context, cfg Config) (_ *Lab, err error) {
	l := &Lab{Config: cfg, EC2: ec2api.New(ec2api.Options{}), hosts: map[string]*Host{}, aws: &awsLab{enis: map[string]*Host{}}}
	l.EC2.OnAttach, l.EC2.OnDetach = l.plugENI, l.unplugENI
	l.EC2.OnChange = l.programENIs
	Down(cfg.Prefix)
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := l.segment(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.serveHandler(ln, l.EC2.Handler())
	l.URL = "http://" + ln.Addr().String() + "/"
	vpc := l.EC2.AddVPC(cfg.Subnet)
	if l.SubnetID, err = l.EC2.AddSubnet(vpc, cfg.Subnet, "us-east-1a"); err != nil {
		return nil, err
	}
	if cfg.Subnet6.IsValid() {
		block, _ := cfg.Subnet6.Addr().Prefix(56)
		if err := l.EC2.AddVPCIPv6(vpc, block); err != nil {
			return nil, err
		}
		if err := l.EC2.AddSubnetIPv6(l.SubnetID, cfg.Subnet6); err != nil {
			return nil, err
		}
	}
	sg := l.EC2.AddSecurityGroup(vpc, cfg.Prefix)
	at := func(last byte) netip.Addr { b := cfg.Subnet.Addr().As4(); b[3] = last; return netip.AddrFrom4(b) }
	// The router is the VPC's own at the subnet's first address: no ENI,
	// no source/destination check on its bridge port.
	l.Router = Host{Name: "router", NS: cfg.Prefix + "-router", IP: cfg.Subnet.Addr().Next(), MAC: "02:00:00:00:00:01", ifname: "lprouter"}
	if cfg.Subnet6.IsValid() {
		l.Router.IP6 = l.at6(1)
	}
	if err := l.wire(&l.Router, false); err != nil {
		return nil, err
	}
	for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
		if err := netnsutil.Exec(l.Router.NS, "sysctl", "-qw", sysctl); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Nodes {
		h, err := l.runInstance(fmt.Sprintf("n%d", i+1), at(byte(11+i)), sg)
		if err != nil {
			return nil, err
		}
		l.Nodes = append(l.Nodes, h)
		nl, err := netnsutil.Listen(netnsutil.Path(h.NS), fmt.Sprintf("127.0.0.1:%d", EndpointPort))
		if err != nil {
			return nil, err
		}
		l.serveHandler(nl, l.EC2.Handler())
		il, err := netnsutil.Listen(netnsutil.Path(h.NS), fmt.Sprintf("127.0.0.1:%d", IMDSPort))
		if err != nil {
			return nil, err
		}
		l.serveHandler(il, imds.New(l.EC2, h.InstanceID, imds.Options{Lag: cfg.IMDSLag}))
	}
	if l.Legacy, err = l.runInstance("legacy", at(200), sg); err != nil {
		return nil, err
	}
	if err := l.externalHost(); err != nil {
		return nil, err
	}
	return l, nil
}

// runInstance launches an instance with its primary ENI at ip (and, with
// an IPv6 subnet, the IPv6 address of the same last byte) and wires a
// host namespace for it.
func (l *Lab) runInstance(name string, ip netip.Addr, sg string) (Host, error) {
	var ip6 netip.Addr
	if l.Subnet6.IsValid() {
		ip6 = l.at6(ip.As4()[3])
	}
	inst, err := l.EC2.RunInstance(ec2api.RunOptions{Type: InstanceType, SubnetID: l.SubnetID, IP: ip, IP6: ip6, Groups: []string{sg}, Role: NodeRole})
	if err != nil {
		return Host{}, fmt.Errorf("instance for %s: %w", name, err)
	}
	var eni ec2api.ENI
	for _, e := range l.EC2.ENIs() {
		if e.InstanceID == inst.ID && e.DeviceIndex == 0 {
			eni = e
		}
	}
	if eni.ID == "" {
		return Host{}, fmt.Errorf("instance %s for %s has no primary ENI", inst.ID, name)
	}
	h := Host{Name: name, NS: l.Prefix + "-" + name, IP: ip, IP6: ip6, PortID: eni.ID, MAC: eni.MAC, InstanceID: inst.ID, ifname: eniIfname(eni.ID)}
	if err := l.wire(&h, true); err != nil {
		return h, err
	}
	l.aws.mu.Lock()
	l.aws.enis[eni.ID] = &h
	l.aws.mu.Unlock()
	l.programENIs(l.EC2.ENIs())
	return h, nil
}

// eniIfname is an ENI's port on the VPC bridge: "le" and the end of its ID.
func eniIfname(id string) string {
	hex := strings.TrimPrefix(id, "eni-")
	return "le" + hex[max(len(hex)-11, 0):]
}

// plugENI hot-plugs an ENI attached to a lab node.
func (l *Lab) plugENI(instanceID string, eni ec2api.ENI) error {
	var node *Host
	for i := range l.Nodes {
		if l.Nodes[i].InstanceID == instanceID {
			node = &l.Nodes[i]
		}
	}
	if node == nil {
		return fmt.Errorf("no lab node is instance %s", instanceID)
	}
	mac, err := net.ParseMAC(eni.MAC)
	if err != nil {
		return err
	}
	nic := &Host{Name: fmt.Sprintf("%s-eth%d", node.Name, eni.DeviceIndex), NS: node.NS, PortID: eni.ID, MAC: eni.MAC, InstanceID: instanceID, ifname: eniIfname(eni.ID)}
	if err := netnsutil.VethBetween(l.vpcNS(), nic.ifname, node.NS, fmt.Sprintf("eth%d", eni.DeviceIndex), mac); err != nil {
		return fmt.Errorf("hot-plug ENI %s into %s: %w", eni.ID, node.NS, err)
	}
	if err := l.bridge(nic.ifname); err != nil {
		_ = netnsutil.Exec(l.vpcNS(), "ip", "link", "del", nic.ifname)
		return err
	}
	l.aws.mu.Lock()
	l.aws.enis[eni.ID] = nic
	l.aws.mu.Unlock()
	return nil
}

// unplugENI removes a detached ENI's link wherever it is (deleting the
// bridge end deletes the pair).
func (l *Lab) unplugENI(_ string, eni ec2api.ENI) {
	l.aws.mu.Lock()
	nic := l.aws.enis[eni.ID]
	delete(l.aws.enis, eni.ID)
	l.aws.mu.Unlock()
	if nic == nil {
		return
	}
	if out, err := netnsutil.Output(l.vpcNS(), "ip", "link", "del", nic.ifname); err != nil && !strings.Contains(out, "Cannot find device") {
		l.setFabricErr(fmt.Errorf("unplug ENI %s: %v: %s", eni.ID, err, strings.TrimSpace(out)))
	}
}

// writeCheck6 is an ENI's source/destination check for IPv6 (see the
// note at the top). Its link-local address is always allowed, so the set
// is never empty.
func writeCheck6(b *strings.Builder, ifname string, e ec2api.ENI) {
	var allowed []string
	if ll, ok := linkLocal(e.MAC); ok {
		allowed = append(allowed, ll.String())
	}
	for _, a := range e.IPv6s {
		allowed = append(allowed, a.String())
	}
	for _, p := range e.IPv6Prefixes {
		allowed = append(allowed, p.String())
	}
	slices.Sort(allowed)
	set := strings.Join(allowed, ", ")
	fmt.Fprintf(b, "  iifname %q ether type ip6 icmpv6 type nd-router-advert drop\n", ifname)
	fmt.Fprintf(b, "  iifname %q ether type ip6 ip6 saddr :: icmpv6 type { nd-neighbor-solicit, mld-listener-report, mld2-listener-report } accept\n", ifname)
	fmt.Fprintf(b, "  iifname %q ether type ip6 ip6 saddr != { %s } drop\n", ifname, set)
	fmt.Fprintf(b, "  oifname %q ether type ip6 ip6 daddr != { %s, ff00::/8 } drop\n", ifname, set)
}

// programENIs writes the VPC bridge's source/destination checks from the
// endpoint's ENIs.
func (l *Lab) programENIs(enis []ec2api.ENI) {
	l.aws.mu.Lock()
	defer l.aws.mu.Unlock()
	l.aws.applied = enis
	var b strings.Builder
	b.WriteString("table bridge vpcni_lab\ndelete table bridge vpcni_lab\ntable bridge vpcni_lab {\n chain srcdst {\n  type filter hook forward priority 0; policy accept;\n")
	for _, e := range enis {
		h := l.aws.enis[e.ID]
		if h == nil {
			continue
		}
		fmt.Fprintf(&b, "  iifname %q ether saddr != %s drop\n", h.ifname, e.MAC)
		if !e.SourceDestCheck {
			continue
		}
		writeCheck6(&b, h.ifname, e)
		var allowed []string
		for _, a := range e.PrivateIPs {
			allowed = append(allowed, a.String())
		}
		for _, p := range e.Prefixes {
			allowed = append(allowed, p.String())
		}
		slices.Sort(allowed)
		if len(allowed) == 0 {
			fmt.Fprintf(&b, "  iifname %q ether type { ip, arp } drop\n", h.ifname)
			fmt.Fprintf(&b, "  oifname %q ether type ip drop\n", h.ifname)
			continue
		}
		set := "{ " + strings.Join(allowed, ", ") + " }"
		fmt.Fprintf(&b, "  iifname %q ether type ip ip saddr != %s drop\n", h.ifname, set)
		fmt.Fprintf(&b, "  iifname %q ether type arp arp saddr ip != %s drop\n", h.ifname, set)
		fmt.Fprintf(&b, "  oifname %q ether type ip ip daddr != %s drop\n", h.ifname, set)
	}
	b.WriteString(" }\n}\n")
	cmd := exec.Command("ip", "netns", "exec", l.vpcNS(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	l.fabricErr = nil
	if out, err := cmd.CombinedOutput(); err != nil {
		l.fabricErr = fmt.Errorf("programming source/destination checks: %v: %s", err, strings.TrimSpace(string(out)))
		fmt.Fprintf(os.Stderr, "lab: %v\n%s", l.fabricErr, b.String())
	}
}

func (l *Lab) setFabricErr(err error) {
	l.aws.mu.Lock()
	l.fabricErr = errors.Join(l.fabricErr, err)
	l.aws.mu.Unlock()
}

// serveHandler serves h on ln until the lab closes.
func (l *Lab) serveHandler(ln net.Listener, h http.Handler) {
	l.listeners = append(l.listeners, ln)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
}
