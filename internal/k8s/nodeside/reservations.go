package nodeside

import (
	"context"
	"net/netip"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// Reservations is the agent's view of the AddressReservations: every one
// of the cluster, from a watch (one object per sticky pod: small), so an
// ADD looks its pod up in memory and waits on no API call. It implements
// agent.Reservations.
type Reservations struct {
	inf cache.SharedIndexInformer
}

// NewReservations connects to the API server; Run starts the watch.
func NewReservations(cfg *rest.Config) (*Reservations, error) {
	c, err := k8s.NewAddressReservations(cfg)
	if err != nil {
		return nil, err
	}
	inf := c.Informer(10 * time.Minute)
	if err := inf.SetTransform(withoutManagedFields); err != nil {
		return nil, err
	}
	return &Reservations{inf: inf}, nil
}

// Run watches until ctx ends.
func (r *Reservations) Run(ctx context.Context) { r.inf.Run(ctx.Done()) }

// Reserved reports pod namespace/name's reservation and its address of
// the first family (invalid while none is recorded, or when the recorded
// one does not parse: the CRD's schema refuses that). Before the first
// list arrived it knows of no reservation: a sticky pod added then gets a
// fresh address this once, rather than every ADD of the node waiting on
// the API server. A dual-stack pod's other reserved addresses are in
// ReservedAddresses.
func (r *Reservations) Reserved(namespace, name string) (netip.Addr, bool) {
	addrs, ok := r.ReservedAddresses(namespace, name)
	if len(addrs) == 0 {
		return netip.Addr{}, ok
	}
	return addrs[0], ok
}

// ReservedAddresses reports pod namespace/name's reservation and every
// address it holds, first family first: one per family the pod had when
// it was recorded (none while nothing is recorded; a reservation recorded
// before dual-stack holds its one address). An entry that does not parse
// is left out (the CRD's schema refuses one).
func (r *Reservations) ReservedAddresses(namespace, name string) ([]netip.Addr, bool) {
	obj, ok, _ := r.inf.GetStore().GetByKey(namespace + "/" + name)
	if !ok {
		return nil, false
	}
	ar, ok := obj.(*v1alpha1.AddressReservation)
	if !ok {
		return nil, false
	}
	addrs, _ := k8s.ReservedAddressesOf(ar)
	return addrs, true
}
