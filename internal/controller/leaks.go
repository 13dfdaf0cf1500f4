package controller

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/pager"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
	"github.com/vpcni/vpcni/internal/leaks"
)

// ClusterReader reads what the cluster says for the leak audit: Nodes,
// pods (metadata only), PodAddresses, AddressReservations and NodeBlocks.
// Each read is a consistent list (as of now, never a lagging watch cache's
// view), a page at a time: the audit reads the cloud first, then the
// cluster, so that whatever the cloud showed with its owner already
// recorded is seen owned. A CRD that is not installed reads as empty (sticky IPs or blocks
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

// listPageSize bounds one response of the reads: the API server and this
// process handle one page of objects at a time, not every pod of the
// cluster in one answer (30,000 pods' metadata is ~30 MB of JSON).
const listPageSize = 500

// eachItem lists a resource a page at a time and hands each object to f.
// The first page is a quorum read; the pages after it are read at the
// same resourceVersion, so the whole list is one consistent snapshot as
// an unpaginated list would be. A continue token that expired midway
// (etcd compacted) makes the pager read the whole list at once instead.
func eachItem(ctx context.Context, list func(context.Context, metav1.ListOptions) (runtime.Object, error), f func(runtime.Object) error) error {
	p := pager.New(list)
	p.PageSize = listPageSize
	return p.EachListItem(ctx, metav1.ListOptions{}, f)
}

// Read implements the leak collector's cluster reader.
func (r *ClusterReader) Read(ctx context.Context) (*leaks.Cluster, error) {
	c := leaks.NewCluster()
	err := eachItem(ctx, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return r.cs.CoreV1().Nodes().List(ctx, o)
	},
		func(obj runtime.Object) error {
			n := obj.(*corev1.Node)
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
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	pods := r.md.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	uids := map[string]string{}
	err = eachItem(ctx, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return pods.List(ctx, o) },
		func(obj runtime.Object) error {
			p := obj.(*metav1.PartialObjectMetadata)
			c.Pods[p.Namespace+"/"+p.Name] = true
			uids[p.Namespace+"/"+p.Name] = string(p.UID)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	err = eachItem(ctx, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return r.pas.List(ctx, o) },
		func(obj runtime.Object) error {
			pa := obj.(*v1alpha1.PodAddress)
			pod := pa.Spec.PodNamespace + "/" + pa.Spec.PodName
			uid, live := uids[pod]
			live = live && (pa.Spec.PodUID == "" || pa.Spec.PodUID == uid)
			// Every family's address is the pod's: a dual-stack pod's
			// IPv6 address is in addresses only. One that does not parse
			// (the agent never writes such) names nothing.
			addrs, _ := k8s.AddressesOf(pa)
			for _, a := range addrs {
				// Two PodAddresses of one address (a pod re-created on
				// another node while the old one's is not yet deleted):
				// the live one wins.
				if old, ok := c.Addresses[a]; ok && old.Live {
					continue
				}
				c.Addresses[a] = leaks.PodAddress{Name: pa.Name, Pod: pod, Node: pa.Spec.Node, Live: live}
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("list PodAddresses: %w", err)
	}
	err = eachItem(ctx, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return r.ars.List(ctx, o) },
		func(obj runtime.Object) error {
			ar := obj.(*v1alpha1.AddressReservation)
			addrs, _ := k8s.ReservedAddressesOf(ar)
			for _, a := range addrs {
				c.Reservations[a] = ar.Namespace + "/" + ar.Name
			}
			return nil
		})
	if err != nil && !absent(err) {
		return nil, fmt.Errorf("list AddressReservations: %w", err)
	}
	err = eachItem(ctx, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return r.nbs.List(ctx, o) },
		func(obj runtime.Object) error {
			nb := obj.(*v1alpha1.NodeBlock)
			if p, err := netip.ParsePrefix(nb.Spec.CIDR); err == nil {
				c.Blocks[p.Masked()] = nb.Spec.Node
			}
			return nil
		})
	if err != nil && !absent(err) {
		return nil, fmt.Errorf("list NodeBlocks: %w", err)
	}
	return c, nil
}
