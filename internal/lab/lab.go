// Package lab builds a whole VPC on one machine, from network namespaces
// only: the VPC segment (a bridge in its own namespace) with the cloud's
// port security on every VM port, a router namespace with the subnet's
// gateway, N node namespaces and a legacy VM outside the cluster — all
// driven by the lab's cloud endpoint (Neutron-compatible, or EC2-compatible
// with instance metadata: see aws.go), which programs the fabric whenever
// its state changes.
package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/lab/novaapi"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// Config is the lab's topology.
type Config struct {
	Prefix string       // namespace prefix, e.g. "vpcni-lab"
	Nodes  int          // cluster nodes
	Subnet netip.Prefix // the tenant subnet, e.g. 10.90.0.0/24
	// Subnet6, if valid, is the network's IPv6 subnet too (a /64 whose
	// addresses Neutron hands out, no address mode): every VM gets an
	// address of it beside its IPv4 one, the router ::1.
	Subnet6 netip.Prefix
	// Cloud is the API the lab serves and its fabric follows: "openstack"
	// (Neutron and Nova's os-interface; the default) or "aws" (EC2 and
	// each node's instance metadata).
	Cloud string
	// IMDSLag is how far an AWS lab's instance metadata lags behind EC2,
	// as the real service does after an assignment.
	IMDSLag time.Duration
}

// Host is a VM on the VPC segment: a namespace whose eth0 is a Neutron port.
type Host struct {
	Name string     `json:"name"`
	NS   string     `json:"namespace"`
	IP   netip.Addr `json:"ip"`
	// IP6 is its IPv6 address (invalid: the lab has no IPv6 subnet).
	IP6    netip.Addr `json:"ip6,omitzero"`
	PortID string     `json:"portID"`
	MAC    string     `json:"mac"`
	// InstanceID is the VM's Nova server (its port's device_id), to which
	// the lab's os-interface stand-in attaches NICs.
	InstanceID string `json:"instanceID,omitempty"`
	ifname     string // its port on the VPC bridge
}

// Lab is a built lab.
type Lab struct {
	Config
	API *neutronapi.Server
	URL string // the endpoint in the caller's namespace
	// Nova is the os-interface stand-in, served with the Neutron API:
	// ComputeURL in the caller's namespace, ComputePath under
	// http://127.0.0.1:EndpointPort in a node's.
	Nova       *novaapi.Server
	ComputeURL string
	SubnetID   string
	// SubnetID6 is the IPv6 subnet's ID ("" without Subnet6).
	SubnetID6 string
	Router    Host
	Nodes     []Host
	Legacy    Host
	// External is a host outside the VPC, behind the router: floating IPs
	// are reached from it. ExtNetID is the external network in the
	// endpoint, RouterID the lab's router.
	External Host
	ExtNetID string
	RouterID string

	// EC2 is an AWS lab's endpoint (nil in an OpenStack lab, whose API
	// is API).
	EC2 *ec2api.Server
	aws *awsLab

	nc        *gophercloud.ServiceClient
	listeners []net.Listener
	fabricErr error
	routes    []string        // extra routes programmed in the router
	fipAddrs  map[string]bool // floating addresses on the router's ext0

	hosts map[string]*Host // port ID -> host, for the fabric
}

// EndpointPort is where every node namespace reaches the endpoint.
const EndpointPort = 9696

func (l *Lab) vpcNS() string { return l.Prefix + "-vpc" }

// Up builds the lab, first removing what a crashed lab of the same prefix
// left.
func Up(ctx context.Context, cfg Config) (_ *Lab, err error) {
	switch cfg.Cloud {
	case "", "openstack":
	case "aws":
		return upAWS(ctx, cfg)
	default:
		return nil, fmt.Errorf("lab: unknown cloud %q (openstack or aws)", cfg.Cloud)
	}
	l := &Lab{Config: cfg, API: neutronapi.New(), hosts: map[string]*Host{}}
	l.Nova = novaapi.New(l.API)
	l.Nova.Plug, l.Nova.Unplug = l.plugNIC, l.unplugNIC
	Down(cfg.Prefix)
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := l.segment(); err != nil {
		return nil, err
	}
	l.API.OnChange = func(*neutronapi.Server) { l.program() }
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.serve(ln)
	l.URL = "http://" + ln.Addr().String() + "/"
	l.ComputeURL = l.URL + ComputePath[1:]
	l.nc = openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})

	n, err := networks.Create(ctx, l.nc, networks.CreateOpts{Name: cfg.Prefix}).Extract()
	if err != nil {
		return nil, err
	}
	gw := cfg.Subnet.Addr().Next()
	gws := gw.String()
	sn, err := subnets.Create(ctx, l.nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: cfg.Subnet.String(), GatewayIP: &gws}).Extract()
	if err != nil {
		return nil, err
	}
	l.SubnetID = sn.ID
	if cfg.Subnet6.IsValid() {
		gw6 := l.at6(1).String()
		sn6, err := subnets.Create(ctx, l.nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv6, CIDR: cfg.Subnet6.Masked().String(), GatewayIP: &gw6}).Extract()
		if err != nil {
			return nil, err
		}
		l.SubnetID6 = sn6.ID
	}
	at := func(last byte) netip.Addr { b := cfg.Subnet.Addr().As4(); b[3] = last; return netip.AddrFrom4(b) }
	if l.Router, err = l.plug(ctx, n.ID, "router", gw, "network:router_interface"); err != nil {
		return nil, err
	}
	for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
		if err := netnsutil.Exec(l.Router.NS, "sysctl", "-qw", sysctl); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Nodes {
		h, err := l.plug(ctx, n.ID, fmt.Sprintf("n%d", i+1), at(byte(11+i)), "compute:lab")
		if err != nil {
			return nil, err
		}
		l.Nodes = append(l.Nodes, h)
		// Each node reaches the endpoint on its own loopback.
		nl, err := netnsutil.Listen(netnsutil.Path(h.NS), fmt.Sprintf("127.0.0.1:%d", EndpointPort))
		if err != nil {
			return nil, err
		}
		l.serve(nl)
	}
	if l.Legacy, err = l.plug(ctx, n.ID, "legacy", at(200), "compute:lab"); err != nil {
		return nil, err
	}
	if err := l.external(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// at6 is the IPv6 subnet's address whose last byte is last (::1 the
// router, ::b the first node — the same last byte as its IPv4 address).
func (l *Lab) at6(last byte) netip.Addr {
	b := l.Subnet6.Masked().Addr().As16()
	b[15] = last
	return netip.AddrFrom16(b)
}

// segment makes the VPC segment: bridge br0 in a namespace of its own.
func (l *Lab) segment() error {
	if err := netnsutil.Add(l.vpcNS()); err != nil {
		return err
	}
	for _, c := range [][]string{{"ip", "link", "add", "br0", "type", "bridge"}, {"ip", "link", "set", "br0", "up"}} {
		if err := netnsutil.Exec(l.vpcNS(), c...); err != nil {
			return err
		}
	}
	return nil
}

// External side: floating IPs come from 203.0.113.0/24 (a documentation
// range, only ever inside the lab's namespaces); the router holds .1 on
// ext0 towards an external host at .254, which routes the tenant subnet
// back via .1 (no SNAT on the router).
const extCIDR = "203.0.113.0/24"

func (l *Lab) external(ctx context.Context) error {
	n, err := networks.Create(ctx, l.nc, networks.CreateOpts{Name: l.Prefix + "-external"}).Extract()
	if err != nil {
		return err
	}
	gw := "203.0.113.1"
	pools := []subnets.AllocationPool{{Start: "203.0.113.10", End: "203.0.113.200"}}
	if _, err := subnets.Create(ctx, l.nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: extCIDR, GatewayIP: &gw, AllocationPools: pools}).Extract(); err != nil {
		return err
	}
	l.ExtNetID = n.ID
	r, err := routers.Create(ctx, l.nc, routers.CreateOpts{Name: l.Prefix}).Extract()
	if err != nil {
		return err
	}
	l.RouterID = r.ID
	if err := l.externalHost(); err != nil {
		return err
	}
	l.API.Lock()
	l.program()
	l.API.Unlock()
	return nil
}

// externalHost wires the external host to the router's ext0.
func (l *Lab) externalHost() error {
	gw := "203.0.113.1"
	l.External = Host{Name: "external", NS: l.Prefix + "-external", IP: netip.MustParseAddr("203.0.113.254")}
	if err := netnsutil.Add(l.External.NS); err != nil {
		return err
	}
	if err := netnsutil.VethBetween(l.Router.NS, "ext0", l.External.NS, "eth0", nil); err != nil {
		return err
	}
	for _, c := range [][]string{{"ip", "addr", "add", gw + "/24", "dev", "ext0"}, {"ip", "link", "set", "ext0", "up"}} {
		if err := netnsutil.Exec(l.Router.NS, c...); err != nil {
			return err
		}
	}
	// The router routes the tenant subnet out without NAT, and the
	// external host routes it back: a cloud whose router does not SNAT
	// (or a provider network). So the external host sees whatever source
	// a packet leaves the VPC with — a pod's own address, or its node's
	// when vpcni's SNAT is on (what the SNAT test looks at). Neutron's
	// router would SNAT the subnet to its gateway; the lab leaves that out.
	for _, c := range [][]string{{"ip", "addr", "add", "203.0.113.254/24", "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"},
		{"ip", "route", "add", l.Subnet.String(), "via", gw}} {
		if err := netnsutil.Exec(l.External.NS, c...); err != nil {
			return err
		}
	}
	return nil
}

// programRouter applies the router's extra routes and the floating IPs:
// each floating address lives on ext0, DNAT to its fixed IP on the way
// in, SNAT back on the way out.
func (l *Lab) programRouter() error {
	if l.RouterID == "" {
		return nil
	}
	var want []string
	for _, r := range l.API.Routers() {
		if r.ID != l.RouterID {
			continue
		}
		for _, rt := range r.Routes {
			want = append(want, rt.Destination+" via "+rt.NextHop)
		}
	}
	var errs []error
	for _, old := range l.routes {
		if !slices.Contains(want, old) {
			_ = netnsutil.Exec(l.Router.NS, append([]string{"ip", "route", "del"}, strings.Fields(old)...)...)
		}
	}
	for _, rt := range want {
		if err := netnsutil.Exec(l.Router.NS, append([]string{"ip", "route", "replace"}, strings.Fields(rt)...)...); err != nil {
			errs = append(errs, err)
		}
	}
	l.routes = want
	var b strings.Builder
	b.WriteString("table ip vpcni_lab_nat\ndelete table ip vpcni_lab_nat\ntable ip vpcni_lab_nat {\n chain pre {\n  type nat hook prerouting priority dstnat; policy accept;\n")
	var post strings.Builder
	addrs := map[string]bool{}
	for _, f := range l.API.FloatingIPs() {
		if f.Fixed() == "" {
			continue
		}
		fmt.Fprintf(&b, "  ip daddr %s dnat to %s\n", f.FloatingIPAddress, f.Fixed())
		fmt.Fprintf(&post, "  oifname \"ext0\" ip saddr %s snat to %s\n", f.Fixed(), f.FloatingIPAddress)
		addrs[f.FloatingIPAddress] = true
	}
	b.WriteString(" }\n chain post {\n  type nat hook postrouting priority srcnat; policy accept;\n")
	b.WriteString(post.String())
	b.WriteString(" }\n}\n")
	cmd := exec.Command("ip", "netns", "exec", l.Router.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("router NAT: %v: %s", err, strings.TrimSpace(string(out))))
	}
	// The floating addresses answer ARP on ext0 while associated; a
	// detached one leaves, so the router does not answer for it itself.
	for a := range addrs {
		_ = netnsutil.Exec(l.Router.NS, "ip", "addr", "replace", a+"/32", "dev", "ext0")
	}
	for a := range l.fipAddrs {
		if !addrs[a] {
			_ = netnsutil.Exec(l.Router.NS, "ip", "addr", "del", a+"/32", "dev", "ext0")
		}
	}
	l.fipAddrs = addrs
	return errors.Join(errs...)
}

func (l *Lab) serve(ln net.Listener) { l.serveHandler(ln, l.handler()) }

// plug makes a port with ip and wires a host namespace to the VPC bridge
// through it.
func (l *Lab) plug(ctx context.Context, netID, name string, ip netip.Addr, owner string) (Host, error) {
	instance := l.server(owner)
	fixed := []ports.IP{{SubnetID: l.SubnetID, IPAddress: ip.String()}}
	var ip6 netip.Addr
	if l.Subnet6.IsValid() {
		ip6 = l.at6(ip.As4()[3])
		fixed = append(fixed, ports.IP{SubnetID: l.SubnetID6, IPAddress: ip6.String()})
	}
	p, err := ports.Create(ctx, l.nc, ports.CreateOpts{NetworkID: netID, Name: name, DeviceOwner: owner, DeviceID: instance,
		FixedIPs: fixed}).Extract()
	if err != nil {
		return Host{}, fmt.Errorf("port for %s: %w", name, err)
	}
	h := Host{Name: name, NS: l.Prefix + "-" + name, IP: ip, IP6: ip6, PortID: p.ID, MAC: p.MACAddress, InstanceID: instance, ifname: "lp" + strings.ReplaceAll(p.ID, "-", "")[:11]}
	if err := l.wire(&h, name != "router"); err != nil {
		return h, err
	}
	l.hosts[p.ID] = &h
	l.API.Lock()
	l.program()
	l.API.Unlock()
	return h, nil
}

// wire makes h's namespace and joins it to the VPC bridge: eth0 carries
// h's MAC and address, default via the gateway unless route is false (the
// router's own port).
func (l *Lab) wire(h *Host, route bool) error {
	if err := netnsutil.Add(h.NS); err != nil {
		return err
	}
	mac, _ := net.ParseMAC(h.MAC)
	if err := netnsutil.VethBetween(l.vpcNS(), h.ifname, h.NS, "eth0", mac); err != nil {
		return err
	}
	bits := fmt.Sprint(l.Subnet.Bits())
	steps := [][]string{{"ip", "addr", "add", h.IP.String() + "/" + bits, "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}}
	if route {
		steps = append(steps, []string{"ip", "route", "add", "default", "via", l.Subnet.Addr().Next().String()})
	}
	if h.IP6.IsValid() {
		// nodad: the cloud gave the address to this port alone, and an
		// address in DAD is unusable for a second. No router
		// advertisements: the default route is the cloud's gateway, as
		// a VM's DHCPv6 or cloud-init would set it.
		steps = append(steps, []string{"sysctl", "-qw", "net.ipv6.conf.eth0.accept_ra=0"},
			[]string{"ip", "-6", "addr", "add", h.IP6.String() + "/" + fmt.Sprint(l.Subnet6.Bits()), "dev", "eth0", "nodad"})
		if route {
			steps = append(steps, []string{"ip", "-6", "route", "add", "default", "via", l.at6(1).String()})
		}
	}
	for _, c := range steps {
		if err := netnsutil.Exec(h.NS, c...); err != nil {
			return err
		}
	}
	return l.bridge(h.ifname)
}

// bridge puts a host's end of a veth on the VPC bridge.
func (l *Lab) bridge(ifname string) error {
	for _, c := range [][]string{{"ip", "link", "set", ifname, "master", "br0"}, {"ip", "link", "set", ifname, "up"}} {
		if err := netnsutil.Exec(l.vpcNS(), c...); err != nil {
			return err
		}
	}
	return nil
}

// program writes the VPC bridge's port security: a frame entering from a
// VM's port must carry a MAC the port allows (its own, or an allowed address
// pair's) and, for IPv4, ARP and IPv6, a source address allowed with that
// MAC — the port's MAC with its fixed IPs, each pair's MAC (the port's when
// the pair names none) with the pair's address, each MAC with its own
// link-local address — what Neutron's port security does. Called with the
// endpoint's lock held.
func (l *Lab) program() {
	var b strings.Builder
	b.WriteString("table bridge vpcni_lab\ndelete table bridge vpcni_lab\ntable bridge vpcni_lab {\n chain portsec {\n  type filter hook forward priority 0; policy accept;\n")
	for _, p := range l.API.Ports() {
		h := l.hosts[p.ID]
		// Like Neutron, no port security on network-owned ports (the
		// router forwards traffic with any source).
		if h == nil || !p.PortSecurity || strings.HasPrefix(p.DeviceOwner, "network:") {
			continue
		}
		macs := []string{p.MACAddress}
		var allowed, allowed6 []string // "mac . ip"
		add := func(mac, ip string) {
			if strings.Contains(ip, ":") {
				allowed6 = append(allowed6, mac+" . "+ip)
			} else {
				allowed = append(allowed, mac+" . "+ip)
			}
		}
		for _, f := range p.FixedIPs {
			add(p.MACAddress, f.IPAddress)
		}
		for _, ap := range p.Pairs {
			mac := cmp.Or(ap.MACAddress, p.MACAddress)
			if !slices.Contains(macs, mac) {
				macs = append(macs, mac)
			}
			add(mac, ap.IPAddress)
		}
		// Each allowed MAC may also send from its own link-local
		// address (router and neighbour discovery), as Neutron allows.
		for _, mac := range macs {
			if ll, ok := linkLocal(mac); ok {
				add(mac, ll.String())
			}
		}
		slices.Sort(allowed)
		slices.Sort(allowed6)
		fmt.Fprintf(&b, "  iifname %q ether saddr != { %s } drop\n", h.ifname, strings.Join(macs, ", "))
		// IPv6, as Neutron's firewall: no router advertisements from a
		// VM; the unspecified source only for what a host sends before
		// it has an address (duplicate address detection, multicast
		// listener reports); any other source allowed with the MAC.
		fmt.Fprintf(&b, "  iifname %q ether type ip6 icmpv6 type nd-router-advert drop\n", h.ifname)
		fmt.Fprintf(&b, "  iifname %q ether type ip6 ip6 saddr :: icmpv6 type { nd-neighbor-solicit, mld-listener-report, mld2-listener-report } accept\n", h.ifname)
		fmt.Fprintf(&b, "  iifname %q ether type ip6 ether saddr . ip6 saddr != { %s } drop\n", h.ifname, strings.Join(allowed6, ", "))
		if len(allowed) == 0 { // no address at all: nothing IPv4 passes
			fmt.Fprintf(&b, "  iifname %q ether type { ip, arp } drop\n", h.ifname)
			continue
		}
		set := "{ " + strings.Join(allowed, ", ") + " }"
		fmt.Fprintf(&b, "  iifname %q ether type ip ether saddr . ip saddr != %s drop\n", h.ifname, set)
		fmt.Fprintf(&b, "  iifname %q ether type arp arp saddr ether . arp saddr ip != %s drop\n", h.ifname, set)
	}
	b.WriteString(" }\n}\n")
	cmd := exec.Command("ip", "netns", "exec", l.vpcNS(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		l.fabricErr = fmt.Errorf("programming port security: %v: %s", err, strings.TrimSpace(string(out)))
		fmt.Fprintf(os.Stderr, "lab: %v\n%s", l.fabricErr, b.String())
		return
	}
	l.fabricErr = l.programRouter()
}

// linkLocal is the fe80::/64 address a host makes from mac (EUI-64).
func linkLocal(mac string) (netip.Addr, bool) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return netip.Addr{}, false
	}
	b := netip.MustParseAddr("fe80::").As16()
	copy(b[8:], []byte{hw[0] ^ 0x02, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]})
	return netip.AddrFrom16(b), true
}

// FabricErr is the last failure to program the fabric (nil: it holds the
// endpoint's state).
func (l *Lab) FabricErr() error {
	if l.aws != nil {
		l.aws.mu.Lock()
		defer l.aws.mu.Unlock()
		return l.fabricErr
	}
	l.API.Lock()
	defer l.API.Unlock()
	return l.fabricErr
}

// Close stops serving the endpoint and removes every namespace.
func (l *Lab) Close() error {
	for _, ln := range l.listeners {
		ln.Close()
	}
	if l.EC2 != nil {
		l.EC2.Close()
	}
	return Down(l.Prefix)
}

// Down removes every namespace of a lab with this prefix.
func Down(prefix string) error {
	var errs []error
	for _, ns := range netnsutil.List(prefix + "-") {
		errs = append(errs, netnsutil.Delete(ns))
	}
	return errors.Join(errs...)
}

// RunDir is where a lab's processes record their PIDs.
func (l *Lab) RunDir() string { return filepath.Join("/run/vpcni-lab", l.Prefix) }
