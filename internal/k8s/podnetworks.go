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

// PodNetworks is a typed client of the PodNetwork resource
// (cluster-scoped), which only the operator writes.
type PodNetworks struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

// NewPodNetworks builds a client from cfg.
func NewPodNetworks(cfg *rest.Config) (*PodNetworks, error) {
	rc, params, err := v1alpha1.NewRESTClient(cfg)
	if err != nil {
		return nil, err
	}
	return &PodNetworks{rc: rc, params: params}, nil
}

// Create creates pn.
func (c *PodNetworks) Create(ctx context.Context, pn *v1alpha1.PodNetwork) error {
	return c.rc.Post().Resource(v1alpha1.PodNetworkResource.Resource).Body(pn).Do(ctx).Error()
}

// Delete deletes one PodNetwork.
func (c *PodNetworks) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Resource(v1alpha1.PodNetworkResource.Resource).Name(name).Body(&opts).Do(ctx).Error()
}

// List lists the PodNetworks opts selects.
func (c *PodNetworks) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.PodNetworkList, error) {
	l := &v1alpha1.PodNetworkList{}
	err := c.rc.Get().Resource(v1alpha1.PodNetworkResource.Resource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Do(ctx).Into(l)
	return l, err
}

// Watch watches the PodNetworks opts selects.
func (c *PodNetworks) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource(v1alpha1.PodNetworkResource.Resource).VersionedParams(&opts, c.params).
		Timeout(timeoutOf(opts)).Watch(ctx)
}

// Informer caches every PodNetwork of the cluster, keyed by name.
func (c *PodNetworks) Informer(resync time.Duration) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, o)
		},
		WatchFuncWithContext: c.Watch,
	}, &v1alpha1.PodNetwork{}, resync, cache.Indexers{})
}

// Get reads one PodNetwork.
func (c *PodNetworks) Get(ctx context.Context, name string) (*v1alpha1.PodNetwork, error) {
	pn := &v1alpha1.PodNetwork{}
	err := c.rc.Get().Resource(v1alpha1.PodNetworkResource.Resource).Name(name).Do(ctx).Into(pn)
	return pn, err
}
