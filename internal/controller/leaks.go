package controller

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
	"github.com/vpcni/vpcni/internal/leaks"
)

// ClusterReader reads what the cluster says for the leak audit: Nodes,
// pods (metadata only), PodAddresses, AddressReservations and NodeBlocks.
// Each read is a quorum list (from etcd, not the API server's watch cache,
// which may lag): the audit reads the cloud first, then the cluster, so
// that whatever the cloud showed with its owner already recorded is seen
// owned. A CRD that is not installed reads as empty (sticky IPs or blocks
// not in use); any other error fails the pass, so nothing is judged on
// half a picture.
type ClusterReader struct {
	// instance reads a Node's spec.providerID (leaks.Cloud.Instance).
	instance func(providerID string) (string, bool)
	cs       kubernetes.Interface
	md       metadata.Interface
	pas      *k8s.PodAddresses
	ars      *k8s.AddressReservations
	nbs      *nodeblocks.Client
	opts     metav1.ListOptions
}

// NewClusterReader connects one; instance reads a Node's spec.providerID
// as the cloud names its VMs (leaks.Cloud.Instance).
func NewClusterReader(cfg *rest.Config, instance func(providerID string) (string, bool)) (*ClusterReader, error) {
	c, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	r := &ClusterReader{instance: instance, cs: c.cs, md: c.md, pas: c.pas}
	if r.ars, err = k8s.NewAddressReservations(c.cfg); err != nil {
		return nil, err
	}
	if r.nbs, err = nodeblocks.NewClient(c.cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// ClusterID names this cluster in the cloud (the leak collector's claims):
// the UID of its kube-system namespace, made once with the cluster and
// never reused.
func ClusterID(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("the cluster's ID (namespace kube-system's UID; or give it): %w", err)
	}
	return string(ns.UID), nil
}

// absent: the resource's CRD is not installed.
func absent(err error) bool { return apierrors.IsNotFound(err) }

// Read implements the leak collector's cluster reader.
func (r *ClusterReader) Read(ctx context.Context) (*leaks.Cluster, error) {
	c := leaks.NewCluster()
	nodes, err := r.cs.CoreV1().Nodes().List(ctx, r.opts)
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		var ips []netip.Addr
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ips = append(ips, ip)
			}
		}
		c.AddNode(n.Name, ips)
		if id, ok := r.instance(n.Spec.ProviderID); ok {
			c.Instances[id] = n.Name
		}
	}
	pods, err := r.md.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).List(ctx, r.opts)
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	uids := map[string]string{}
	for _, p := range pods.Items {
		c.Pods[p.Namespace+"/"+p.Name] = true
		uids[p.Namespace+"/"+p.Name] = string(p.UID)
	}
	pas, err := r.pas.List(ctx, r.opts)
	if err != nil {
		return nil, fmt.Errorf("list PodAddresses: %w", err)
	}
	for _, pa := range pas.Items {
		a, err := netip.ParseAddr(pa.Spec.Address)
		if err != nil {
			continue
		}
		pod := pa.Spec.PodNamespace + "/" + pa.Spec.PodName
		uid, live := uids[pod]
		live = live && (pa.Spec.PodUID == "" || pa.Spec.PodUID == uid)
		// Two PodAddresses of one address (a pod re-created on another
		// node while the old one's is not yet deleted): the live one wins.
		if old, ok := c.Addresses[a]; ok && old.Live {
			continue
		}
		c.Addresses[a] = leaks.PodAddress{Name: pa.Name, Pod: pod, Node: pa.Spec.Node, Live: live}
	}
	ars, err := r.ars.List(ctx, r.opts)
	if err != nil && !absent(err) {
		return nil, fmt.Errorf("list AddressReservations: %w", err)
	}
	if err == nil {
		for _, ar := range ars.Items {
			if a, err := netip.ParseAddr(ar.Spec.Address); err == nil {
				c.Reservations[a] = ar.Namespace + "/" + ar.Name
			}
		}
	}
	nbs, err := r.nbs.List(ctx, r.opts)
	if err != nil && !absent(err) {
		return nil, fmt.Errorf("list NodeBlocks: %w", err)
	}
	if err == nil {
		for _, nb := range nbs.Items {
			if p, err := netip.ParsePrefix(nb.Spec.CIDR); err == nil {
				c.Blocks[p.Masked()] = nb.Spec.Node
			}
		}
	}
	return c, nil
}
