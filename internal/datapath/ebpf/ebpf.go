// Package ebpf is datapath mode "ebpf": the routed veth mode (package
// veth, wired exactly as there) with a tc BPF fast path on top
// (bpf/fastpath.c) that skips the node's IP stack for pod traffic:
//
//	uplink ingress     packet for a local pod -> bpf_redirect_peer into it
//	host veth ingress  packet for a local pod -> bpf_redirect_peer into it;
//	                   for a fast destination (the uplink's subnets, or
//	                   fastCIDRs) -> bpf_fib_lookup + bpf_redirect_neigh
//	                   out of the uplink, with the uplink's MAC as in veth
//
// What must pass netfilter still does: the Service CIDRs (kube-proxy),
// every packet of a connection conntrack NATed (found with the
// bpf_skb_ct_lookup kfunc: replies of ClusterIP, NodePort and hostPort
// connections), ICMP, fragments, anything with IP options. The routed
// path stays wired underneath, so proxy ARP, GARP and port security are
// those of mode veth, and a packet the programs pass is routed as there.
//
// When the programs cannot load (no BTF, an old kernel, a verifier that
// refuses them, no BPF filesystem) the mode logs why, reports
// vpcni_datapath_fastpath_active 0 and runs as plain veth — unless
// require is set, when the agent refuses to start — and tries again every
// retryEvery from its reconcile. At start it is never half on: the
// uplink's program goes on first, and if anything fails nothing of the
// fast path stays attached. A pod whose bandwidth is limited (the
// bandwidth plugin's qdiscs on its host veth) stays on the routed path.
//
// Programs and maps are pinned under pinPath; the pods map (keyed by
// address, holding the host veth's ifindex and both MACs) survives an
// agent restart, the new agent's programs take over each filter in one
// replace, and the old programs go once no filter holds them.
package ebpf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/family"
)

// Mode is the mode's name in vpcnid.yaml.
const Mode = "ebpf"

func init() {
	datapath.Register(datapath.Registration{
		Name:        Mode,
		NewSettings: func() datapath.Settings { return &Settings{} },
		New: func(node datapath.Node, s datapath.Settings) (datapath.Datapath, error) {
			return New(node, s.(*Settings))
		},
		// IPv6 pods are wired as mode veth wires them; their packets take
		// the routed path through the node's stack (FastPath says so).
		Families: []family.Family{family.V4, family.V6},
		Prepare: func(node datapath.Node, s datapath.Settings) error {
			if err := veth.PrepareNode(node.Uplink, node.Families...); err != nil {
				return err
			}
			// The host's BPF filesystem, from the privileged step, so
			// that pins outlive the agent's container.
			return ensureBPFFS(s.(*Settings).PinPath)
		},
		Needs: func(node datapath.Node, _ datapath.Settings) datapath.Needs {
			n := veth.NodeNeeds(node.Uplink, node.Families...)
			n.Sysctls = append(n.Sysctls, datapath.Sysctl{Key: "net/core/bpf_jit_enable", Value: "1", Why: "the fast path's programs run JIT-compiled (interpreted, they are slower than the stack they skip)"})
			return n
		},
		Uninstall: func(node datapath.Node, s datapath.Settings) error { return uninstall(node, s.(*Settings)) },
		// Programs, and the pins at the default path (another mode's
		// agent does not know this one's settings): a later switch back
		// must not start from a map that old.
		Clear: func(node datapath.Node) error { return clear(node.Uplink, DefaultPinPath) },
	})
}

// DefaultPinPath is where the programs and maps are pinned.
const DefaultPinPath = "/sys/fs/bpf/vpcni"

// Settings is the mode's section of vpcnid.yaml (datapath.ebpf).
type Settings struct {
	// GARP: as in mode veth (datapath.veth.garp), default true.
	GARP *bool `json:"garp,omitempty"`
	// ServiceCIDRs always pass through the node's stack, where kube-proxy
	// DNATs them (default [10.96.0.0/12]).
	svcpath.Settings
	// FastCIDRs are the destinations a pod's packet may leave by the uplink
	// for without the node's stack (default: the uplink's own subnets).
	// Traffic elsewhere is routed by the stack, where SNAT and the node's
	// firewall see it: list the VPC's other subnets here only if nothing
	// on the node must see that traffic.
	FastCIDRs []string `json:"fastCIDRs,omitempty"`
	// PinPath is the directory on a BPF filesystem for the programs and
	// maps (default /sys/fs/bpf/vpcni; bpffs is mounted on /sys/fs/bpf if
	// it is not).
	PinPath string `json:"pinPath,omitempty"`
	// Require refuses to start without the fast path instead of falling
	// back to the plain routed path.
	Require bool `json:"require,omitempty"`
	// KernelBTF is the kernel's BTF the programs are relocated against
	// (default /sys/kernel/btf/vmlinux).
	KernelBTF string `json:"kernelBTF,omitempty"`
}

// Defaults implements datapath.Settings.
func (s *Settings) Defaults() {
	if s.GARP == nil {
		on := true
		s.GARP = &on
	}
	s.Settings.Defaults()
	if s.PinPath == "" {
		s.PinPath = DefaultPinPath
	}
}

// Validate implements datapath.Settings: every bad field at once.
func (s *Settings) Validate() error {
	errs := []error{s.Settings.Validate(),
		svcpath.ValidateCIDRs("fastCIDRs", s.FastCIDRs, "would take every destination past the node's stack, its SNAT and firewall included")}
	if !strings.HasPrefix(s.PinPath, "/") {
		errs = append(errs, fmt.Errorf("pinPath: %q is not an absolute path", s.PinPath))
	}
	return errors.Join(errs...)
}

// Datapath is the mode on one node.
type Datapath struct {
	*veth.Veth
	log *slog.Logger

	s *Settings

	mu sync.Mutex
	fp *fastPath // nil: fell back to the plain routed path
	// why the fast path is off (fp nil).
	why string
	// tried is when the fast path was last started.
	tried time.Time
	// ipv6: the node's pods get IPv6 addresses, which the programs leave
	// to the node's stack (they parse IPv4 alone).
	ipv6 bool
}

// fastAddr is the address of a's the programs know: its IPv4 one (invalid
// for an IPv6-only pod, whose packets all take the routed path).
func fastAddr(a *alloc.Allocation) netip.Addr {
	l, _ := a.LeaseOf(family.V4)
	return l.Address
}

// onNIC says whether any of a pod's addresses lives on a secondary NIC:
// such a pod stays on the routed path, whichever family's lease (the
// first, or another) the NIC holds.
func onNIC(a *alloc.Allocation) bool {
	return slices.ContainsFunc(a.Leases(), func(l alloc.Lease) bool { return l.NIC != nil })
}

// New opens the routed veth mode and puts the fast path on it, or falls
// back (see the package comment).
func New(node datapath.Node, s *Settings) (*Datapath, error) {
	v, err := veth.NewVeth(node.Uplink, node.MTU, *s.GARP, node.Families...)
	if err != nil {
		return nil, err
	}
	log := node.Log
	if log == nil {
		log = slog.Default()
	}
	d := &Datapath{Veth: v, log: log, s: s, ipv6: family.Has(node.Families, family.V6)}
	if err := d.tryStart(); err != nil && s.Require {
		_ = v.Close()
		return nil, fmt.Errorf("ebpf fast path (datapath.ebpf.require is set): %w", err)
	}
	return d, nil
}

// retryEvery is how often a node that fell back tries the fast path again
// (a kfunc's module loaded later, a BPF filesystem mounted).
const retryEvery = time.Minute

// tryStart loads and attaches the fast path, or falls back: off with
// everything an earlier agent left, the reason kept and logged.
func (d *Datapath) tryStart() error {
	d.tried = time.Now()
	fp, err := start(d.Veth, d.s)
	if err != nil {
		d.why = err.Error()
		// An earlier agent's programs would act on pods with maps no one
		// keeps current any more: off they come.
		if cerr := clear(d.Uplink, d.s.PinPath); cerr != nil {
			d.log.Warn("ebpf: could not take an earlier agent's programs off", "err", cerr)
		}
		if !d.s.Require {
			d.log.Warn("ebpf fast path unavailable: falling back to the plain routed veth path (pods work, through the node's stack); set datapath.ebpf.require to refuse this instead", "reason", err, "retry", retryEvery)
		}
		return err
	}
	d.fp, d.why = fp, ""
	d.log.Info("ebpf fast path loaded", "uplink", d.Uplink, "pinPath", d.s.PinPath)
	return nil
}

// start loads the programs, fills the prefix maps and puts the uplink's
// program on (with the pods map a previous agent pinned, or empty until
// the first Reconcile: an address not in it takes the routed path).
func start(v *veth.Veth, s *Settings) (*fastPath, error) {
	link, err := netlink.LinkByName(v.Uplink)
	if err != nil {
		return nil, err
	}
	fast, err := fastPrefixes(link, s)
	if err != nil {
		return nil, err
	}
	fp, err := load(s.KernelBTF, s.PinPath, link.Attrs().Index)
	if err != nil {
		return nil, err
	}
	// The pinned map may name veths gone since (pods deleted while no
	// agent or another mode ran): a redirect to them would drop.
	if err := fp.pruneStale(); err != nil {
		fp.close()
		return nil, fmt.Errorf("pods map: %w", err)
	}
	// The fast path handles IPv4 alone: an IPv6 Service CIDR (a
	// dual-stack cluster's) needs no entry, its traffic takes the routed
	// path through the node's stack anyway.
	var v4 []netip.Prefix
	for _, p := range s.CIDRs() {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		}
	}
	if err := setPrefixes(fp.services, v4); err != nil {
		fp.close()
		return nil, fmt.Errorf("services map: %w", err)
	}
	if err := setPrefixes(fp.fast, fast); err != nil {
		fp.close()
		return nil, fmt.Errorf("fast map: %w", err)
	}
	// The uplink's program first: without it nothing else is attached.
	if err := attach(fp.uplinkIdx, fp.uplink, progUplink); err != nil {
		fp.close()
		return nil, err
	}
	fp.attachedOnce = true
	return fp, nil
}

// fastPrefixes are fastCIDRs, or the uplink's own IPv4 subnets.
func fastPrefixes(uplink netlink.Link, s *Settings) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range s.FastCIDRs {
		out = append(out, netip.MustParsePrefix(c))
	}
	if len(out) > 0 {
		return out, nil
	}
	addrs, err := netlink.AddrList(uplink, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			ones, _ := a.Mask.Size()
			if ones < 32 {
				out = append(out, netip.PrefixFrom(ip, ones).Masked())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("uplink %s has no IPv4 subnet to send pods' traffic to directly: set datapath.ebpf.fastCIDRs", uplink.Attrs().Name)
	}
	return out, nil
}

// Info implements datapath.Datapath.
func (d *Datapath) Info() datapath.Info {
	i := d.Veth.Info()
	i.Mode = Mode
	return i
}

// FastPath says whether the programs run, or why not, and what they did.
func (d *Datapath) FastPath() datapath.FastPath {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fp == nil {
		return datapath.FastPath{Reason: d.why}
	}
	var note string
	if d.ipv6 {
		note = "for IPv4; IPv6 takes the routed path through the node's stack (the programs parse IPv4 only)"
	}
	counts, err := d.fp.counters()
	if err != nil {
		return datapath.FastPath{Active: true, Reason: "counters: " + err.Error(), Note: note}
	}
	return datapath.FastPath{Active: true, Packets: counts, Note: note}
}

// Close implements datapath.Datapath: the programs stay attached and
// pinned, for the next agent.
func (d *Datapath) Close() error {
	d.mu.Lock()
	if d.fp != nil {
		d.fp.close()
		d.fp = nil
		d.why = "closed"
	}
	d.mu.Unlock()
	return d.Veth.Close()
}

// Setup implements datapath.Datapath: the routed wiring, then the pod in
// the pods map and the program on its host veth. A pod on a secondary NIC
// stays on the routed path (its traffic leaves by the NIC, which the
// programs do not send out of), and so does a shaped pod (the bandwidth
// plugin's qdiscs on its host veth would be bypassed, and its ingress
// qdisc cannot share the link with clsact).
func (d *Datapath) Setup(ctx context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	w, err := d.Veth.Setup(ctx, a)
	if err != nil || onNIC(a) || a.Shaped || !fastAddr(a).IsValid() {
		return w, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fp == nil {
		return w, nil
	}
	if err := d.accelerate(a, w); errors.Is(err, errShaped) {
		_ = d.fp.deletePod(fastAddr(a))
	} else if err != nil {
		_ = d.fp.deletePod(fastAddr(a))
		_ = d.Veth.Teardown(ctx, a)
		return alloc.Wiring{}, &datapath.SetupError{Step: "ebpf fast path", Err: err}
	}
	return w, nil
}

// accelerate records the pod and attaches the program to its host veth.
func (d *Datapath) accelerate(a *alloc.Allocation, w alloc.Wiring) error {
	host, podIf := w.Interfaces[0], w.Interfaces[1]
	link, err := netlink.LinkByName(host.Name)
	if err != nil {
		return err
	}
	if err := unshaped(link); err != nil {
		return err
	}
	v, err := podEntry(link.Attrs().Index, podIf.MAC, host.MAC)
	if err != nil {
		return err
	}
	if err := d.fp.putPod(fastAddr(a), v); err != nil {
		return fmt.Errorf("pods map: %w", err)
	}
	return attach(link.Attrs().Index, d.fp.pod, progPod)
}

func podEntry(ifindex int, podMAC, hostMAC string) (pod, error) {
	pm, err := net.ParseMAC(podMAC)
	if err != nil {
		return pod{}, err
	}
	hm, err := net.ParseMAC(hostMAC)
	if err != nil {
		return pod{}, err
	}
	return entry(ifindex, pm, hm), nil
}

// Teardown implements datapath.Datapath: the pod leaves the pods map
// first, so nothing is redirected to a veth on its way out; its filter
// goes with the veth.
func (d *Datapath) Teardown(ctx context.Context, a *alloc.Allocation) error {
	var errs []error
	d.mu.Lock()
	if ip := fastAddr(a); d.fp != nil && ip.IsValid() {
		if err := d.fp.deletePod(ip); err != nil {
			errs = append(errs, fmt.Errorf("pods map: delete %s: %w", ip, err))
		}
	}
	d.mu.Unlock()
	return errors.Join(append(errs, d.Veth.Teardown(ctx, a))...)
}
