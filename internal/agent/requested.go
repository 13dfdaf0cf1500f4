package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/family"
)

// requestedAddresses are the addresses the runtime asks for by name, if
// any: CNI_ARGS IP=<address>[,<address>] (the convention of the
// reference plugins), or the "ips" capability (runtimeConfig.ips, which
// the conflist must enable: "capabilities": {"ips": true}). An address,
// or an address with a prefix length (the capability's form; the length
// is the subnet's business, not the runtime's, and is ignored). One
// address per family at most, of a family the node's pods get (fams):
// vpcni wires one interface with one address of each.
func requestedAddresses(args string, conf *netConf, fams []family.Family) (map[family.Family]netip.Addr, *api.Error) {
	var from, val []string
	for _, kv := range strings.Split(args, ";") {
		if k, v, _ := strings.Cut(kv, "="); k == "IP" {
			for _, one := range strings.Split(v, ",") {
				from, val = append(from, "CNI_ARGS IP"), append(val, one)
			}
		}
	}
	for _, v := range conf.RuntimeConfig.IPs {
		from, val = append(from, "runtimeConfig.ips"), append(val, v)
	}
	if len(val) > len(fams) {
		return nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("%d addresses requested (%s); vpcni wires one interface with one address of each family (%s)", len(val), strings.Join(val, ", "), family.Join(fams)), "")
	}
	out := map[family.Family]netip.Addr{}
	for i, v := range val {
		s := v
		if p, err := netip.ParsePrefix(s); err == nil {
			s = p.Addr().String()
		}
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Is4In6() || ip.Zone() != "" || !ip.IsGlobalUnicast() {
			return nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("%s %q is not a unicast IPv4 or IPv6 address", from[i], v), "")
		}
		f := family.Of(ip)
		if !family.Has(fams, f) {
			return nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("%s %q is an %s address, and this node's pods get %s only (ipFamilies)", from[i], v, f, family.Join(fams)), "")
		}
		if was, ok := out[f]; ok {
			return nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("two %s addresses requested (%s, %s); vpcni wires one of each family", f, was, ip), "")
		}
		out[f] = ip
	}
	return out, nil
}

// dropRecord removes the record of an ADD that failed before its pod ever
// used the address; a requested address is recorded as leaving in the same
// write (untake gives it back).
func (a *Agent) dropRecord(rec *alloc.Allocation) error {
	if rec.Requested {
		return a.store.Leave(rec)
	}
	return a.store.Delete(rec.ContainerID, rec.IfName)
}

// untake undoes the allocation of an ADD that failed before its pod ever
// used the address: a requested address goes back to the provider (it is
// the pod's, and the pod may be retried on another node) in the
// background — the failed ADD holds the node's wiring lock. Any other
// goes back to the pool: behind every other free address when its wiring
// failed (wiringErr: the address may be why), else first in line.
func (a *Agent) untake(rec *alloc.Allocation, wiringErr error) {
	for _, l := range rec.Leases() {
		pool := a.familyPool(rec, l)
		switch {
		case rec.Requested:
			if err := pool.GiveBackLater(rec.Key(), l.Address); err != nil {
				a.log.Error("requested address of a failed ADD not given back to the provider", "address", l.Address, "err", err)
			}
		case wiringErr != nil:
			pool.Unwired(l.Address, wiringErr)
		default:
			pool.Untake(l.Address)
		}
	}
}

// Reservations tells the agent which pods keep their addresses wherever
// they start (internal/k8s/nodeside.Reservations: vpcni-controller's
// AddressReservations of StatefulSet pods, read from an informer cache,
// so an ADD waits on no API call).
type Reservations interface {
	// ReservedAddresses: ok when pod namespace/name has a reservation;
	// addrs are its reserved addresses, one per family, none until the
	// pod first got one.
	ReservedAddresses(namespace, name string) (addrs []netip.Addr, ok bool)
}

// SetReservations connects the agent to the pods' address reservations;
// call it before Run. Without it no address follows a pod (except one the
// runtime asks for by name).
func (a *Agent) SetReservations(r Reservations) { a.reservations = r }

// reserved puts the pod's reserved addresses among those an ADD asks for
// (wants, by family), and says whether the pod has a reservation: its
// addresses are then its own (they leave with the pod at DEL, to the
// cloud, not the node's pool). A reserved address is asked for; a family
// the reservation holds none of yet takes any address, which becomes the
// pod's; a family this node's pods do not get is not asked for. A
// runtime's own request must agree with the reservation: two answers to
// "which address is this pod's" is a configuration error, not something
// to pick from.
func (a *Agent) reserved(namespace, name string, wants map[family.Family]netip.Addr) (bool, *api.Error) {
	if a.reservations == nil || name == "" {
		return false, nil
	}
	rs, ok := a.reservations.ReservedAddresses(namespace, name)
	if !ok {
		return false, nil
	}
	for _, r := range rs {
		f := family.Of(r)
		if !family.Has(a.cfg.Families(), f) {
			continue
		}
		if w, asked := wants[f]; asked && w != r {
			return true, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("pod %s/%s asks for %s, but its AddressReservation keeps %s for it", namespace, name, w, r), "")
		}
		wants[f] = r
	}
	return true, nil
}

// reservedFor: the allocation's first address is reserved for its pod.
func (a *Agent) reservedFor(rec *alloc.Allocation) bool {
	if a.reservations == nil || rec.PodName == "" {
		return false
	}
	rs, ok := a.reservations.ReservedAddresses(rec.PodNamespace, rec.PodName)
	return ok && slices.Contains(rs, rec.Address)
}
