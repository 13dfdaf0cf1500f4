// Package nlutil holds the few netlink helpers every datapath mode needs:
// a dump the kernel interrupted is retried, "already gone" is one test,
// and the node's uplink and address are found the same way in each mode.
package nlutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/datapath"
)

// RetryDump repeats a netlink dump the kernel interrupted (its result
// would be inconsistent).
func RetryDump[T any](dump func() ([]T, error)) ([]T, error) {
	var out []T
	var err error
	for range 5 {
		out, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return out, err
}

// IsNotFound says whether err means the link, route, neighbour or
// namespace is not there (any more).
func IsNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ESRCH)
}

// DefaultRouteLink names the interface of the node's IPv4 default route
// in the main table, or of its IPv6 one on a node without the first (an
// IPv6-only node).
func DefaultRouteLink() (string, error) {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := RetryDump(func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(fam, &netlink.Route{Table: 254}, netlink.RT_FILTER_TABLE)
		})
		if err != nil {
			return "", fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if (r.Dst == nil || prefixLen(r) == 0) && r.LinkIndex > 0 {
				l, err := netlink.LinkByIndex(r.LinkIndex)
				if err != nil {
					return "", fmt.Errorf("default route's interface %d: %w", r.LinkIndex, err)
				}
				return l.Attrs().Name, nil
			}
		}
	}
	return "", errors.New("no default route (IPv4 or IPv6) to take the uplink from; set uplink in the config")
}

func prefixLen(r netlink.Route) int {
	ones, _ := r.Dst.Mask.Size()
	return ones
}

// IsZeroMask says whether m is /0.
func IsZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// LinkIPv4 is a link's first global IPv4 address (invalid: none, or no
// such link).
func LinkIPv4(name string) netip.Addr {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return netip.Addr{}
	}
	addrs, err := RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_V4) })
	if err != nil {
		return netip.Addr{}
	}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP.To4()); ok && ad.Scope == int(netlink.SCOPE_UNIVERSE) {
			return ip
		}
	}
	return netip.Addr{}
}

// LinkIPv6 is a link's first global IPv6 address (invalid: none, or no
// such link). Link-local, tentative and deprecated addresses are not the
// node's address on the network.
func LinkIPv6(name string) netip.Addr {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return netip.Addr{}
	}
	addrs, err := RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_V6) })
	if err != nil {
		return netip.Addr{}
	}
	for _, ad := range addrs {
		ip, ok := netip.AddrFromSlice(ad.IP)
		if ok && ad.Scope == int(netlink.SCOPE_UNIVERSE) && ad.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DEPRECATED|unix.IFA_F_DADFAILED) == 0 {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// WriteSysctl sets /proc/sys/<key> (slashes, e.g. "net/ipv4/ip_forward")
// only when it differs, so an agent without a writable /proc/sys starts
// once a privileged step (vpcnictl install-cni) set it.
func WriteSysctl(key, value string) error {
	path := "/proc/sys/" + key
	if cur, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(key, "/", "."), value, err)
	}
	return nil
}

// EnableForwarding turns on IPv4 forwarding (datapath.Forwarding).
func EnableForwarding() error { return WriteSysctls([]datapath.Sysctl{datapath.Forwarding}) }

// WriteSysctls sets each sysctl that names a value (see WriteSysctl); one
// that only has to exist is left to the mode to check.
func WriteSysctls(list []datapath.Sysctl) error {
	var errs []error
	for _, s := range list {
		if s.Value != "" {
			errs = append(errs, WriteSysctl(s.Key, s.Value))
		}
	}
	return errors.Join(errs...)
}

// DeleteOwnedVeth removes the node-side veth name (its other end goes with
// it) if it is there and carries alias, or no alias yet: an ADD cut short
// right after creating it left it bare, and its name is that attachment's
// hash. A link that carries another alias, or a bare one that is not a
// veth, is someone else's and is left alone.
func DeleteOwnedVeth(name, alias string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("look up %s: %w", name, err)
	}
	// Only a veth: another mode's link can carry a vpcni alias too (the
	// bridge mode's bridge does), and is never this helper's to delete.
	if have := link.Attrs().Alias; link.Type() != "veth" || have != alias && have != "" {
		return fmt.Errorf("%s belongs to %q, not to %q: left alone", name, have, alias)
	}
	if err := netlink.LinkDel(link); err != nil && !IsNotFound(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// UplinkName is name, or the default route's interface when name is empty
// (the node's config leaves the uplink to the agent).
func UplinkName(name string) (string, error) {
	if name != "" {
		return name, nil
	}
	return DefaultRouteLink()
}

// Uplink finds the uplink link (see UplinkName).
func Uplink(name string) (netlink.Link, error) {
	name, err := UplinkName(name)
	if err != nil {
		return nil, err
	}
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("uplink %q: %w", name, err)
	}
	return link, nil
}

// ErrNetnsPath marks OpenPod's failure to open the namespace path itself:
// the caller's input (a CNI ADD's netns), or a pod already gone.
var ErrNetnsPath = errors.New("cannot open the pod's network namespace")

// Pod is a pod's network namespace opened for netlink work inside it.
type Pod struct {
	NS netns.NsHandle
	*netlink.Handle
}

// OpenPod opens the namespace at path and a netlink handle in it; the
// caller closes both with Close.
func OpenPod(path string) (*Pod, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrNetnsPath, path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink in pod netns %s: %w", path, err)
	}
	return &Pod{NS: ns, Handle: h}, nil
}

// Close releases the handle and the namespace.
func (p *Pod) Close() {
	p.Handle.Close()
	p.NS.Close()
}
