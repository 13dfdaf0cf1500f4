package doctor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// ProbeNSPrefix starts the name of the namespace doctor probes link types
// in; it is deleted, with every link in it, when the probe ends.
const ProbeNSPrefix = "vpcni-doctor-"

// ProbeLinks asks the kernel to create a link of each kind inside a
// throwaway network namespace: the only sure test (a module may be built
// in, loadable on demand, or missing). It returns each kind's error (nil:
// created); the error is for the namespace itself.
func ProbeLinks(kinds []string) (map[string]error, error) {
	name := fmt.Sprintf("%s%d", ProbeNSPrefix, os.Getpid())
	// A leftover of a killed run with this PID would stop the creation.
	_ = netns.DeleteNamed(name)
	ns, err := newNamedNS(name)
	if err != nil {
		return nil, fmt.Errorf("a namespace to probe link types in: %w", err)
	}
	defer func() { _ = netns.DeleteNamed(name) }()
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", name, err)
	}
	defer h.Close()
	// macvlan and ipvlan need a parent with a MAC: a veth end.
	parent := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "parent0"}, PeerName: "parent1"}
	parentErr := h.LinkAdd(parent)
	out := map[string]error{}
	for i, kind := range kinds {
		attrs := netlink.LinkAttrs{Name: fmt.Sprintf("probe%d", i)}
		var link netlink.Link
		switch kind {
		case "veth":
			link = &netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("peer%d", i)}
		case "bridge":
			link = &netlink.Bridge{LinkAttrs: attrs}
		case "macvlan", "ipvlan":
			if parentErr != nil {
				out[kind] = fmt.Errorf("no veth to be its parent: %w", parentErr)
				continue
			}
			attrs.ParentIndex = parent.Index
			link = &netlink.Macvlan{LinkAttrs: attrs, Mode: netlink.MACVLAN_MODE_BRIDGE}
			if kind == "ipvlan" {
				link = &netlink.IPVlan{LinkAttrs: attrs, Mode: netlink.IPVLAN_MODE_L2}
			}
		default:
			link = &netlink.GenericLink{LinkAttrs: attrs, LinkType: kind}
		}
		out[kind] = h.LinkAdd(link)
	}
	return out, nil
}

// newNamedNS creates a named namespace (as ip netns add does) without
// leaving the calling thread in it.
func newNamedNS(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return 0, err
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// Leave the thread locked: Go ends it with this goroutine rather
		// than reuse a thread in the wrong namespace.
		return 0, errors.Join(err, serr)
	}
	runtime.UnlockOSThread()
	return ns, err
}

// ReadSysctl reads /proc/sys/<key>, trimmed; fs.ErrNotExist when the
// kernel has no such key.
func ReadSysctl(key string) (string, error) {
	path := "/proc/sys/" + key
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if st.IsDir() {
		return "", nil
	}
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// ReadUplink finds the uplink as the agent does (the configured name, or
// the default route's interface) and reads what Uplink judges.
func ReadUplink(name string) (Link, error) {
	l, err := nlutil.Uplink(name)
	if err != nil {
		return Link{}, err
	}
	a := l.Attrs()
	out := Link{Name: a.Name, Up: a.Flags&net.FlagUp != 0 && a.OperState != netlink.OperDown, MTU: a.MTU}
	if ip := nlutil.LinkIPv4(a.Name); ip.IsValid() {
		out.IPv4 = ip.String()
	}
	if a.MasterIndex != 0 {
		if m, err := netlink.LinkByIndex(a.MasterIndex); err == nil {
			out.Master = m.Attrs().Name
			if ip := nlutil.LinkIPv4(out.Master); out.IPv4 == "" && ip.IsValid() {
				out.IPv4 = ip.String()
			}
		}
	}
	return out, nil
}

// BTF says whether the kernel has the bpf() syscall (it then shows
// kernel.unprivileged_bpf_disabled) and describes its own types
// (/sys/kernel/btf/vmlinux), which eBPF programs built once for every
// kernel (CO-RE) need. Nothing in vpcni loads eBPF today, so either
// answer is ok: it is said for the tools an operator may add.
func BTF(exists func(path string) bool) Result {
	yes := map[bool]string{true: "yes", false: "no"}
	return Result{Name: "kernel bpf", Status: OK, Detail: fmt.Sprintf("bpf() syscall: %s, BTF (/sys/kernel/btf/vmlinux): %s; vpcni itself needs neither",
		yes[exists("/proc/sys/kernel/unprivileged_bpf_disabled")], yes[exists("/sys/kernel/btf/vmlinux")])}
}

// Exists says whether path is there.
func Exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
