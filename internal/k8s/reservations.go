package k8s

import (
	"context"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// reservations is a typed client of the AddressReservation resource
// (namespaced, named as its pod).
type reservations struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

const reservationResource = "addressreservations"

func newReservations(cfg *rest.Config) (*reservations, error) {
	rc, params, err := v1alpha1.NewRESTClient(cfg)
	if err != nil {
		return nil, err
	}
	return &reservations{rc: rc, params: params}, nil
}

func (c *reservations) Create(ctx context.Context, ar *v1alpha1.AddressReservation) error {
	return c.rc.Post().Namespace(ar.Namespace).Resource(reservationResource).Body(ar).Do(ctx).Error()
}

// Update writes ar as read (its resourceVersion): a Conflict means look again.
func (c *reservations) Update(ctx context.Context, ar *v1alpha1.AddressReservation) error {
	return c.rc.Put().Namespace(ar.Namespace).Resource(reservationResource).Name(ar.Name).Body(ar).Do(ctx).Error()
}

func (c *reservations) Delete(ctx context.Context, namespace, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Namespace(namespace).Resource(reservationResource).Name(name).Body(&opts).Do(ctx).Error()
}

func (c *reservations) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.AddressReservationList, error) {
	l := &v1alpha1.AddressReservationList{}
	err := c.rc.Get().Resource(reservationResource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Do(ctx).Into(l)
	return l, err
}

func (c *reservations) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource(reservationResource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Watch(ctx)
}

// informer caches every AddressReservation of the cluster, keyed
// namespace/name (the pod's).
func (c *reservations) informer(resync time.Duration) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		WatchFuncWithContext: c.Watch,
	}, &v1alpha1.AddressReservation{}, resync, cache.Indexers{})
}

// Reservations is the agent's view of the AddressReservations: every one
// of the cluster, from a watch (one object per sticky pod: small), so an
// ADD looks its pod up in memory and waits on no API call. It implements
// agent.Reservations.
type Reservations struct {
	inf cache.SharedIndexInformer
}

// NewReservations connects to the API server; Run starts the watch.
func NewReservations(cfg *rest.Config) (*Reservations, error) {
	c, err := newReservations(cfg)
	if err != nil {
		return nil, err
	}
	return &Reservations{inf: c.informer(10 * time.Minute)}, nil
}

// Run watches until ctx ends.
func (r *Reservations) Run(ctx context.Context) { r.inf.Run(ctx.Done()) }

// Reserved reports pod namespace/name's reservation and its address
// (invalid while none is recorded, or when the recorded one does not
// parse: the CRD's schema refuses that). Before the first list arrived it
// knows of no reservation: a sticky pod added then gets a fresh address
// this once, rather than every ADD of the node waiting on the API server.
func (r *Reservations) Reserved(namespace, name string) (netip.Addr, bool) {
	obj, ok, _ := r.inf.GetStore().GetByKey(namespace + "/" + name)
	if !ok {
		return netip.Addr{}, false
	}
	ar, ok := obj.(*v1alpha1.AddressReservation)
	if !ok {
		return netip.Addr{}, false
	}
	a, _ := netip.ParseAddr(ar.Spec.Address)
	return a, true
}
