package nlutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// PodIPv6Sysctls readies a pod's interface for its IPv6 addresses, in the
// pod's namespace: IPv6 on (a runtime may have turned it off for the
// namespace: a fresh one has it on), no router advertisements taken (the
// pod's addresses and routes are vpcni's, from its leases, even where it
// hears the subnet router's), no duplicate address detection (for its
// link-local address: the pod's own have IFA_F_NODAD). The last two are
// defence only, so a /proc/sys the agent cannot write (a container that is
// not privileged mounts it read-only) leaves them. IPv6 turned off cannot
// be left: that is an error naming the fix.
func PodIPv6Sysctls(netnsPath, ifName string) error {
	conf := "net/ipv6/conf/" + ifName + "/"
	return netnsutil.Do(netnsPath, func() error {
		if v, err := os.ReadFile("/proc/sys/" + conf + "disable_ipv6"); err != nil {
			return fmt.Errorf("read %s: %w: the node's kernel has IPv6 off (ipv6.disable=1)?", conf+"disable_ipv6", err)
		} else if strings.TrimSpace(string(v)) == "1" {
			if err := WriteSysctl(conf+"disable_ipv6", "0"); err != nil {
				return fmt.Errorf("IPv6 is off in the pod's namespace (the runtime set net.ipv6.conf.default.disable_ipv6=1) and cannot be turned on for %s: %w", ifName, err)
			}
		}
		var errs []error
		for _, key := range []string{"accept_ra", "accept_dad"} {
			if err := WriteSysctl(conf+key, "0"); err != nil && !errors.Is(err, syscall.EROFS) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}

// AddPodAddresses puts each of a's addresses on the pod's interface link
// (in the pod namespace pod is a handle of) with its subnet's prefix, the
// L2 modes' way: an IPv6 one without DAD, since the address is the pod's
// alone and DAD would only leave it unusable for ~2 s, after the pod's
// IPv6 sysctls are set. An address already there is kept.
func AddPodAddresses(pod *netlink.Handle, link netlink.Link, a *alloc.Allocation) error {
	if _, ok := a.LeaseOf(family.V6); ok {
		if err := PodIPv6Sysctls(a.Netns, a.IfName); err != nil {
			return &datapath.SetupError{Step: "pod IPv6 sysctls", Err: err}
		}
	}
	for _, l := range a.Leases() {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: l.Address.AsSlice(), Mask: net.CIDRMask(l.Prefix.Bits(), l.Address.BitLen())}}
		if l.Address.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := pod.AddrReplace(link, addr); err != nil {
			return &datapath.SetupError{Step: "pod address " + l.Address.String(), Err: err}
		}
	}
	return nil
}
