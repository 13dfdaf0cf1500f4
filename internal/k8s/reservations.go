package k8s

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// AddressReservations is a typed client of the AddressReservation
// resource (namespaced, named as its pod).
type AddressReservations struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

const reservationResource = "addressreservations"

// NewAddressReservations builds a client from cfg.
func NewAddressReservations(cfg *rest.Config) (*AddressReservations, error) {
	rc, params, err := v1alpha1.NewRESTClient(cfg)
	if err != nil {
		return nil, err
	}
	return &AddressReservations{rc: rc, params: params}, nil
}

// Create creates ar.
func (c *AddressReservations) Create(ctx context.Context, ar *v1alpha1.AddressReservation) error {
	return c.rc.Post().Namespace(ar.Namespace).Resource(reservationResource).Body(ar).Do(ctx).Error()
}

// Update writes ar as read (its resourceVersion): a Conflict means look again.
func (c *AddressReservations) Update(ctx context.Context, ar *v1alpha1.AddressReservation) error {
	return c.rc.Put().Namespace(ar.Namespace).Resource(reservationResource).Name(ar.Name).Body(ar).Do(ctx).Error()
}

// Delete deletes one AddressReservation.
func (c *AddressReservations) Delete(ctx context.Context, namespace, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Namespace(namespace).Resource(reservationResource).Name(name).Body(&opts).Do(ctx).Error()
}

// List lists the AddressReservations opts selects.
func (c *AddressReservations) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.AddressReservationList, error) {
	l := &v1alpha1.AddressReservationList{}
	err := c.rc.Get().Resource(reservationResource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Do(ctx).Into(l)
	return l, err
}

// Watch watches the AddressReservations opts selects.
func (c *AddressReservations) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource(reservationResource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Watch(ctx)
}

// Informer caches every AddressReservation of the cluster, keyed
// namespace/name (the pod's).
func (c *AddressReservations) Informer(resync time.Duration) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		WatchFuncWithContext: c.Watch,
	}, &v1alpha1.AddressReservation{}, resync, cache.Indexers{})
}
