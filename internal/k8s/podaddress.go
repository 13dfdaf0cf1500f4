// Package k8s is what vpcni's two sides in Kubernetes share: the API's
// vocabulary (the vpcni.io/ip resource, PodAddress names, labels and
// index), typed clients of the PodAddress and AddressReservation
// resources, Events, the work queue's loop, and how to reach the API
// server. The agent's side is internal/k8s/nodeside (vpcnid), the
// controller's internal/controller (vpcni-controller); this package
// imports neither the agent nor a cloud, so neither binary links the
// other's code through it.
//
// A PodAddress (vpcni.io/v1alpha1, cluster-scoped; its Go types are in
// internal/apis/vpcni/v1alpha1) is the agent's public record of one
// allocation. The agent creates it after a pod's ADD and deletes it after
// the DEL. vpcni-controller deletes the PodAddress of a pod that no longer
// exists; the agent then releases the address — at once when it runs, or
// at its next start when it was down. The agent stays the only writer to
// its node's cloud port, so the controller never races it there.
package k8s

import (
	"crypto/sha256"
	"encoding/hex"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
)

// The PodAddress API's label and index.
const (
	// LabelNode selects a node's PodAddresses.
	LabelNode = v1alpha1.LabelNode
	// IndexPod indexes PodAddresses by "namespace/name" of their pod.
	IndexPod = "pod"
)

// PodAddressName names the object of one attachment on one node: stable,
// short, and a valid object name whatever the container ID looks like.
func PodAddressName(node, containerID, ifName string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + containerID + "\x00" + ifName))
	return "pa-" + hex.EncodeToString(sum[:10])
}

// NodeLabel is the LabelNode value of a node (v1alpha1.NodeLabel).
func NodeLabel(node string) string { return v1alpha1.NodeLabel(node) }

// NewPodAddress is the object of one attachment, as the agent creates it.
func NewPodAddress(s v1alpha1.PodAddressSpec) *v1alpha1.PodAddress {
	return &v1alpha1.PodAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{
			Name:   PodAddressName(s.Node, s.ContainerID, s.IfName),
			Labels: map[string]string{LabelNode: NodeLabel(s.Node)},
		},
		Spec: s,
	}
}

// PodIndex indexes PodAddresses by their pod (IndexPod). The informers
// hold nothing else; another object gets no index entry rather than an
// error, which the informer's store would turn into a panic.
func PodIndex(obj any) ([]string, error) {
	pa, ok := obj.(*v1alpha1.PodAddress)
	if !ok {
		return nil, nil
	}
	return []string{pa.Spec.PodNamespace + "/" + pa.Spec.PodName}, nil
}

// RestConfig is the kubeconfig's cluster ($KUBECONFIG when empty), or the
// pod's own service account when there is neither.
func RestConfig(kubeconfig string) (*rest.Config, error) { return nodeblocks.RestConfig(kubeconfig) }
