// Package lab builds a whole OpenStack-style VPC on one machine, from
// network namespaces only: the VPC segment (a bridge in its own namespace)
// with Neutron-like port security on every VM port, a router namespace with
// the subnet's gateway, N node namespaces and a legacy VM outside the
// cluster — all driven by the lab's Neutron-compatible endpoint, which
// programs the fabric whenever its state changes.
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
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutronep"
)

// Config is the lab's topology.
type Config struct {
	Prefix string       // namespace prefix, e.g. "vpcni-lab"
	Nodes  int          // cluster nodes
	Subnet netip.Prefix // the tenant subnet, e.g. 10.90.0.0/24
}

// Host is a VM on the VPC segment: a namespace whose eth0 is a Neutron port.
type Host struct {
	Name   string     `json:"name"`
	NS     string     `json:"namespace"`
	IP     netip.Addr `json:"ip"`
	PortID string     `json:"portID"`
	MAC    string     `json:"mac"`
	ifname string     // its port on the VPC bridge
}

// Lab is a built lab.
type Lab struct {
	Config
	API      *neutronapi.Server
	URL      string // the endpoint in the caller's namespace
	SubnetID string
	Router   Host
	Nodes    []Host
	Legacy   Host

	nc        *gophercloud.ServiceClient
	listeners []net.Listener
	fabricErr error
	hosts     map[string]*Host // port ID -> host, for the fabric
}

// EndpointPort is where every node namespace reaches the endpoint.
const EndpointPort = 9696

func (l *Lab) vpcNS() string { return l.Prefix + "-vpc" }

// Up builds the lab, first removing what a crashed lab of the same prefix
// left.
func Up(ctx context.Context, cfg Config) (_ *Lab, err error) {
	l := &Lab{Config: cfg, API: neutronapi.New(), hosts: map[string]*Host{}}
	Down(cfg.Prefix)
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := netnsutil.Add(l.vpcNS()); err != nil {
		return nil, err
	}
	for _, c := range [][]string{{"ip", "link", "add", "br0", "type", "bridge"}, {"ip", "link", "set", "br0", "up"}} {
		if err := netnsutil.Exec(l.vpcNS(), c...); err != nil {
			return nil, err
		}
	}
	l.API.OnChange = func(*neutronapi.Server) { l.program() }
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l.serve(ln)
	l.URL = "http://" + ln.Addr().String() + "/"
	l.nc = neutronep.Client(l.URL)

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
	at := func(last byte) netip.Addr { b := cfg.Subnet.Addr().As4(); b[3] = last; return netip.AddrFrom4(b) }
	if l.Router, err = l.plug(ctx, n.ID, "router", gw, "network:router_interface"); err != nil {
		return nil, err
	}
	if err := netnsutil.Exec(l.Router.NS, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		h, err := l.plug(ctx, n.ID, fmt.Sprintf("n%d", i+1), at(byte(11+i)), "compute:lab")
		if err != nil {
			return nil, err
		}
		l.Nodes = append(l.Nodes, h)
		// Each node reaches the endpoint on its own loopback.
		var nl net.Listener
		err = netnsutil.Do(netnsutil.Path(h.NS), func() (err error) {
			nl, err = net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", EndpointPort))
			return err
		})
		if err != nil {
			return nil, err
		}
		l.serve(nl)
	}
	if l.Legacy, err = l.plug(ctx, n.ID, "legacy", at(200), "compute:lab"); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Lab) serve(ln net.Listener) {
	l.listeners = append(l.listeners, ln)
	srv := &http.Server{Handler: l.API.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
}

// plug makes a port with ip and wires a host namespace to the VPC bridge
// through it: eth0 carries the port's MAC and address, default via the
// gateway (the router's own address excepted).
func (l *Lab) plug(ctx context.Context, netID, name string, ip netip.Addr, owner string) (Host, error) {
	p, err := ports.Create(ctx, l.nc, ports.CreateOpts{NetworkID: netID, Name: name, DeviceOwner: owner,
		FixedIPs: []ports.IP{{SubnetID: l.SubnetID, IPAddress: ip.String()}}}).Extract()
	if err != nil {
		return Host{}, fmt.Errorf("port for %s: %w", name, err)
	}
	h := Host{Name: name, NS: l.Prefix + "-" + name, IP: ip, PortID: p.ID, MAC: p.MACAddress, ifname: "lp" + strings.ReplaceAll(p.ID, "-", "")[:11]}
	if err := netnsutil.Add(h.NS); err != nil {
		return h, err
	}
	mac, _ := net.ParseMAC(h.MAC)
	if err := vethBetween(l.vpcNS(), h.ifname, h.NS, "eth0", mac); err != nil {
		return h, err
	}
	bits := fmt.Sprint(l.Subnet.Bits())
	steps := [][]string{{"ip", "addr", "add", ip.String() + "/" + bits, "dev", "eth0"}, {"ip", "link", "set", "eth0", "up"}}
	if name != "router" {
		steps = append(steps, []string{"ip", "route", "add", "default", "via", l.Subnet.Addr().Next().String()})
	}
	for _, c := range steps {
		if err := netnsutil.Exec(h.NS, c...); err != nil {
			return h, err
		}
	}
	for _, c := range [][]string{{"ip", "link", "set", h.ifname, "master", "br0"}, {"ip", "link", "set", h.ifname, "up"}} {
		if err := netnsutil.Exec(l.vpcNS(), c...); err != nil {
			return h, err
		}
	}
	l.hosts[p.ID] = &h
	l.API.Lock()
	l.program()
	l.API.Unlock()
	return h, nil
}

// vethBetween creates a veth pair born in two namespaces; the second end
// gets mac.
func vethBetween(ns1, name1, ns2, name2 string, mac net.HardwareAddr) error {
	h1, err := netns.GetFromPath(netnsutil.Path(ns1))
	if err != nil {
		return err
	}
	defer h1.Close()
	h2, err := netns.GetFromPath(netnsutil.Path(ns2))
	if err != nil {
		return err
	}
	defer h2.Close()
	nl, err := netlink.NewHandleAt(h1)
	if err != nil {
		return err
	}
	defer nl.Close()
	return nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name1}, PeerName: name2, PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(int(h2))})
}

// program writes the VPC bridge's port security: a frame entering from a
// VM's port must carry the port's MAC and, for IPv4 and ARP, a source
// address among the port's fixed IPs and allowed address pairs — what
// Neutron's port security does. Called with the endpoint's lock held.
func (l *Lab) program() {
	var b strings.Builder
	b.WriteString("table bridge vpcni_lab\ndelete table bridge vpcni_lab\ntable bridge vpcni_lab {\n chain portsec {\n  type filter hook forward priority 0; policy accept;\n")
	for _, p := range l.API.Ports() {
		h := l.hosts[p.ID]
		if h == nil || !p.PortSecurity {
			continue
		}
		var allowed []string
		for _, f := range p.FixedIPs {
			allowed = append(allowed, f.IPAddress)
		}
		for _, ap := range p.Pairs {
			allowed = append(allowed, ap.IPAddress)
		}
		slices.Sort(allowed)
		set := "{ " + strings.Join(allowed, ", ") + " }"
		fmt.Fprintf(&b, "  iifname %q ether saddr != %s drop\n", h.ifname, p.MACAddress)
		fmt.Fprintf(&b, "  iifname %q ether type ip ip saddr != %s drop\n", h.ifname, set)
		fmt.Fprintf(&b, "  iifname %q ether type arp arp saddr ip != %s drop\n", h.ifname, set)
	}
	b.WriteString(" }\n}\n")
	cmd := exec.Command("ip", "netns", "exec", l.vpcNS(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		l.fabricErr = fmt.Errorf("programming port security: %v: %s", err, strings.TrimSpace(string(out)))
		fmt.Fprintf(os.Stderr, "lab: %v\n%s", l.fabricErr, b.String())
		return
	}
	l.fabricErr = nil
}

// FabricErr is the last failure to program the fabric (nil: it holds the
// endpoint's state).
func (l *Lab) FabricErr() error {
	l.API.Lock()
	defer l.API.Unlock()
	return l.fabricErr
}

// Close stops serving the endpoint and removes every namespace.
func (l *Lab) Close() error {
	for _, ln := range l.listeners {
		ln.Close()
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
