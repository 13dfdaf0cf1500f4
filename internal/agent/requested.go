package agent

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
)

// requestedAddress is the address the runtime asks for by name, if any:
// CNI_ARGS IP=<address> (the convention of the reference plugins), or
// the "ips" capability (runtimeConfig.ips, which the conflist must enable:
// "capabilities": {"ips": true}). An address, or an address with a prefix
// length (the capability's form; the length is the subnet's business, not
// the runtime's, and is ignored). One address at most: vpcni wires one.
func requestedAddress(args string, conf *netConf) (netip.Addr, *api.Error) {
	var from, val []string
	for _, kv := range strings.Split(args, ";") {
		if k, v, _ := strings.Cut(kv, "="); k == "IP" {
			from, val = append(from, "CNI_ARGS IP"), append(val, v)
		}
	}
	for _, v := range conf.RuntimeConfig.IPs {
		from, val = append(from, "runtimeConfig.ips"), append(val, v)
	}
	switch len(val) {
	case 0:
		return netip.Addr{}, nil
	case 1:
	default:
		return netip.Addr{}, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("%d addresses requested (%s); vpcni wires one interface with one address", len(val), strings.Join(val, ", ")), "")
	}
	s := val[0]
	if p, err := netip.ParsePrefix(s); err == nil {
		s = p.Addr().String()
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is4() || !ip.IsGlobalUnicast() {
		return netip.Addr{}, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("%s %q is not a unicast IPv4 address", from[0], val[0]), "")
	}
	return ip, nil
}

// untake undoes the allocation of an ADD that failed before its pod ever
// used the address: a requested address goes back to the provider (it is
// the pod's, and the pod may be retried on another node) in the
// background — the failed ADD holds the node's wiring lock — any other to
// the head of the pool.
func (a *Agent) untake(rec *alloc.Allocation) {
	if !rec.Requested {
		a.addrs.Untake(rec.Address)
		return
	}
	if err := a.addrs.GiveBackLater(rec.Key(), rec.Address); err != nil {
		a.log.Error("requested address of a failed ADD not given back to the provider", "address", rec.Address, "err", err)
	}
}
