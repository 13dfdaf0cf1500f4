// Package controller is vpcni-controller's reconcilers: the PodAddresses
// of pods that are gone (Orphans), per-node blocks of the pod ranges
// (BlockAssigner), the routed pod subnet (RouteReconciler), pods'
// floating IPs (FloatingIPs), the AddressReservations of sticky
// StatefulSet pods and the takeover of a dead node's sticky address
// (StickyKeeper), the leak collector's reader of the cluster
// (ClusterReader), and the pod admission webhook with its certificates
// (WebhookHandler, Certs). It runs in vpcni-controller only (vpcnictl
// audit reads the cluster with ClusterReader); what it shares with the
// agent's side is in internal/k8s.
//
// The reconcilers that reach the cloud do so through interfaces their
// consumers own (StickyCloud here; floatingip.Cloud, routes.Cloud and
// leaks.Cloud in their packages), which a registered cloud implements
// (internal/cloudconfig): no reconciler names a cloud.
package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/k8s"
)

// controllerEvents are vpcni-controller's.
func controllerEvents() k8s.Events {
	return k8s.NewEvents(corev1.EventSource{Component: "vpcni-controller"})
}

// clients are what vpcni-controller's reconcilers read and write the
// cluster with, under its user agent.
type clients struct {
	cfg *rest.Config
	cs  kubernetes.Interface
	md  metadata.Interface
	pas *k8s.PodAddresses
}

// The client-side rate limit of each reconciler's clients, when the
// kubeconfig sets none. client-go's own default, 5 requests/s in bursts
// of 10, is a kubelet's: it held the blocks back (a block is two writes,
// its create and its status, and an Event), so 100 new nodes waited
// 39.5 s for their last block, 7.4 s without it (make bench-scale), and
// it slowed every routes pass, which writes each block's condition. The API server's priority and fairness still
// shares it out: the controller's requests queue there behind the
// cluster's own, as kube-controller-manager's do.
const (
	clientQPS   = 100
	clientBurst = 200
)

// clientConfig is cfg under vpcni-controller's user agent and rate limit.
func clientConfig(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "vpcni-controller"
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = clientQPS, clientBurst
	}
	return cfg
}

func newClients(cfg *rest.Config) (*clients, error) {
	cfg = clientConfig(cfg)
	c := &clients{cfg: cfg}
	var err error
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.md, err = metadata.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.pas, err = k8s.NewPodAddresses(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// dropManagedFields has an informer cache its objects without their
// managed fields, which no reconciler reads: they are a third of a
// PodAddress's size in memory, and the controller caches every
// PodAddress of the cluster (30,000 at 1,000 nodes of 30 pods).
func dropManagedFields(inf cache.SharedIndexInformer) error {
	return inf.SetTransform(func(obj any) (any, error) {
		if m, err := meta.Accessor(obj); err == nil {
			m.SetManagedFields(nil)
		}
		return obj, nil
	})
}
