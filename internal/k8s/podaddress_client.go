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

// PodAddresses is a typed client of the PodAddress resource, with the
// calls the node side and vpcni-controller make and no others. It speaks
// JSON: the API server serves custom resources as JSON (or CBOR), never
// protobuf, whatever the rest.Config it is built from prefers.
type PodAddresses struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

// NewPodAddresses builds a client from cfg.
func NewPodAddresses(cfg *rest.Config) (*PodAddresses, error) {
	rc, params, err := v1alpha1.NewRESTClient(cfg)
	if err != nil {
		return nil, err
	}
	return &PodAddresses{rc: rc, params: params}, nil
}

// Get reads one PodAddress.
func (c *PodAddresses) Get(ctx context.Context, name string) (*v1alpha1.PodAddress, error) {
	pa := &v1alpha1.PodAddress{}
	err := c.rc.Get().Resource(v1alpha1.Resource.Resource).Name(name).Do(ctx).Into(pa)
	return pa, err
}

// Create creates pa.
func (c *PodAddresses) Create(ctx context.Context, pa *v1alpha1.PodAddress) error {
	return c.rc.Post().Resource(v1alpha1.Resource.Resource).Body(pa).Do(ctx).Error()
}

// Delete deletes one PodAddress.
func (c *PodAddresses) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Resource(v1alpha1.Resource.Resource).Name(name).Body(&opts).Do(ctx).Error()
}

// List lists the PodAddresses opts selects.
func (c *PodAddresses) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.PodAddressList, error) {
	l := &v1alpha1.PodAddressList{}
	err := c.rc.Get().Resource(v1alpha1.Resource.Resource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Do(ctx).Into(l)
	return l, err
}

// Watch watches the PodAddresses opts selects.
func (c *PodAddresses) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource(v1alpha1.Resource.Resource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Watch(ctx)
}

// timeoutOf is the client-side timeout of a list or watch: the one the
// reflector asked the server for, none otherwise (as generated clients do).
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Informer caches the PodAddresses that labelSelector matches ("" for
// all). Every stored object decodes into v1alpha1.PodAddress: the CRD's
// structural schema has the API server refuse other field types and drop
// unknown fields, so no single object can fail a whole list.
func (c *PodAddresses) Informer(labelSelector string, resync time.Duration, indexers cache.Indexers) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = labelSelector
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = labelSelector
			return c.Watch(ctx, o)
		},
	}, &v1alpha1.PodAddress{}, resync, indexers)
}
