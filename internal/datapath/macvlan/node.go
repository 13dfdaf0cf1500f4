package macvlan

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
)

// defaultRouteLink names the interface of the node's IPv4 default route.
func defaultRouteLink() (string, error) {
	routes, err := retryDump(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 254}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return "", fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if isDefault(r) {
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				return "", fmt.Errorf("default route's interface %d: %w", r.LinkIndex, err)
			}
			return l.Attrs().Name, nil
		}
	}
	return "", errors.New("no IPv4 default route to take the uplink from; set uplink in the config")
}

func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// linkIP is a link's first global IPv4 address (invalid: none).
func linkIP(name string) netip.Addr {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return netip.Addr{}
	}
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_V4) })
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

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ESRCH)
}

// retryDump repeats a netlink dump the kernel interrupted.
func retryDump[T any](dump func() ([]T, error)) ([]T, error) {
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
