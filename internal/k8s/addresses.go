package k8s

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// AddressesOf is every address of a PodAddress, first family first: its
// addresses, or — for an object an agent wrote before dual-stack — its
// address alone. Readers that decide what an address is used by (leaks,
// blocks, reservations) must read all of them: a dual-stack pod's second
// address is in addresses only. An entry that does not parse is left out
// and named in the error; the others are returned all the same, so a
// caller chooses whether one bad entry spoils the object.
func AddressesOf(pa *v1alpha1.PodAddress) ([]netip.Addr, error) {
	return parseAddresses(pa.Spec.Address, pa.Spec.Addresses)
}

// ReservedAddressesOf is every address an AddressReservation holds, first
// family first: its addresses, or for one recorded before dual-stack its
// address alone (none while nothing is recorded). Errors as AddressesOf.
func ReservedAddressesOf(ar *v1alpha1.AddressReservation) ([]netip.Addr, error) {
	return parseAddresses(ar.Spec.Address, ar.Spec.Addresses)
}

// parseAddresses reads first and then all, each address once: an object
// has first among all (the CRD's rule for a reservation, the agent's way
// for a PodAddress), and one written by hand that does not still has both
// counted.
func parseAddresses(first string, all []string) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	for _, s := range append([]string{first}, all...) {
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("address %q: %w", s, err))
			continue
		}
		a = a.Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, errors.Join(errs...)
}

// AddressStrings spells addresses as the API's objects carry them.
func AddressStrings(addrs []netip.Addr) []string {
	out := make([]string, len(addrs))
	for i, a := range addrs {
		out[i] = a.String()
	}
	return out
}
