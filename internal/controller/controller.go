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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

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

func newClients(cfg *rest.Config) (*clients, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "vpcni-controller"
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
