// Package nodeblocks is the NodeBlock API (vpcni.io/v1alpha1) as vpcni
// uses it: a typed client, and the agent's view of its own node's blocks
// (Source), with which it asks vpcni-controller for another block. The
// controller's side, which assigns and reclaims blocks, is in
// internal/controller (BlockAssigner); the block arithmetic both rely on
// is ipam.Blocks.
//
// It imports neither the agent nor a provider, so a provider can use it.
package nodeblocks

import (
	"context"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// Client is a typed client of the NodeBlock resource. JSON only: the API
// server serves custom resources as JSON (or CBOR), never protobuf.
type Client struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

// NewClient builds a client from cfg.
func NewClient(cfg *rest.Config) (*Client, error) {
	rc, params, err := v1alpha1.NewRESTClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{rc: rc, params: params}, nil
}

const resource = "nodeblocks"

// Get reads one NodeBlock.
func (c *Client) Get(ctx context.Context, name string) (*v1alpha1.NodeBlock, error) {
	nb := &v1alpha1.NodeBlock{}
	err := c.rc.Get().Resource(resource).Name(name).Do(ctx).Into(nb)
	return nb, err
}

// Create creates nb and returns it as stored (with its resourceVersion).
func (c *Client) Create(ctx context.Context, nb *v1alpha1.NodeBlock) (*v1alpha1.NodeBlock, error) {
	out := &v1alpha1.NodeBlock{}
	err := c.rc.Post().Resource(resource).Body(nb).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus replaces nb's status; the API server refuses it (Conflict)
// unless nb's resourceVersion is still the stored one.
func (c *Client) UpdateStatus(ctx context.Context, nb *v1alpha1.NodeBlock) (*v1alpha1.NodeBlock, error) {
	out := &v1alpha1.NodeBlock{}
	err := c.rc.Put().Resource(resource).Name(nb.Name).SubResource("status").Body(nb).Do(ctx).Into(out)
	return out, err
}

// Delete deletes a NodeBlock, with the preconditions in opts.
func (c *Client) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Resource(resource).Name(name).Body(&opts).Do(ctx).Error()
}

// List lists NodeBlocks.
func (c *Client) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.NodeBlockList, error) {
	l := &v1alpha1.NodeBlockList{}
	err := c.rc.Get().Resource(resource).VersionedParams(&opts, c.params).Timeout(timeoutOf(opts)).Do(ctx).Into(l)
	return l, err
}

// Watch watches NodeBlocks.
func (c *Client) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource(resource).VersionedParams(&opts, c.params).Timeout(timeoutOf(opts)).Watch(ctx)
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Informer caches the NodeBlocks labelSelector matches ("" for all).
func (c *Client) Informer(labelSelector string, resync time.Duration, indexers cache.Indexers) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = labelSelector
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = labelSelector
			return c.Watch(ctx, o)
		},
	}, &v1alpha1.NodeBlock{}, resync, indexers)
}

// RestConfig is the kubeconfig's cluster ($KUBECONFIG when empty), or the
// pod's own service account when there is neither.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a pod and no kubeconfig given: %w", err)
	}
	return cfg, nil
}
