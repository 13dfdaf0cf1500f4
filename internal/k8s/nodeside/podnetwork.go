package nodeside

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// EventPodNetworkNotServed is the Warning on a pod whose address is not
// of the PodNetwork it names (vpcni.io/network): vpcnid gives a pod an
// address of its PodNetwork at its ADD, or fails the ADD; a pod that
// started before its agent served PodNetworks, or whose annotation was
// changed by hand after it started, keeps the address it got.
const EventPodNetworkNotServed = "VpcniPodNetworkNotServed"

// warnNetworkNotServed says once, on the pod, that its address is of
// another network than the PodNetwork it names: the operator asked for
// another subnet or other security groups and must not believe the pod
// has them. The pod keeps that address until it is recreated.
func (n *Node) warnNetworkNotServed(pod *corev1.Pod, att *alloc.Allocation) {
	network := pod.Annotations[v1alpha1.AnnotationNetwork]
	if network == "" || network == att.PodNetwork {
		return
	}
	n.mu.Lock()
	if n.notServed == nil {
		n.notServed = map[types.UID]bool{}
	}
	seen := n.notServed[pod.UID]
	n.notServed[pod.UID] = true
	n.mu.Unlock()
	if seen {
		return
	}
	has := "the node's default network"
	if att.PodNetwork != "" {
		has = "PodNetwork " + att.PodNetwork
	}
	n.log.Warn("pod's address is not of its PodNetwork", "pod", pod.Namespace+"/"+pod.Name, "addresses", att.Addresses(), "network", network, "has", has)
	n.recorder.Eventf(pod, corev1.EventTypeWarning, EventPodNetworkNotServed,
		"the pod names PodNetwork %s (%s) but its %s on %s is of %s, with that network's subnet and security groups (it started before vpcnid served PodNetworks, or the annotation changed after it started): recreate the pod to move it",
		network, v1alpha1.AnnotationNetwork, addressWords(att.Addresses()), n.name, has)
}

// addressWords names a pod's addresses in a message: "address 10.0.0.5",
// "addresses 10.0.0.5 and fd00::5".
func addressWords(addrs []netip.Addr) string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	if len(s) == 1 {
		return "address " + s[0]
	}
	return "addresses " + strings.Join(s, " and ")
}
