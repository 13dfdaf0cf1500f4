package nodeside

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// EventPodNetworkNotServed is the Warning on a pod whose PodNetwork
// (vpcni.io/network) the agent does not serve: vpcnid gives every pod its
// address from the node's default network, whatever PodNetwork
// vpcni-controller's webhook recorded on it.
const EventPodNetworkNotServed = "VpcniPodNetworkNotServed"

// warnNetworkNotServed says once, on the pod, that it holds an address of
// the node's default network although a PodNetwork selected it: the
// operator asked for another subnet or other security groups and must not
// believe the pod has them. The pod keeps that address until it is
// recreated, as any pod whose network changes after it started.
func (n *Node) warnNetworkNotServed(pod *corev1.Pod) {
	network := pod.Annotations[v1alpha1.AnnotationNetwork]
	if network == "" {
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
	n.log.Warn("pod's PodNetwork not served by this agent: its address is from the node's default network", "pod", pod.Namespace+"/"+pod.Name, "network", network)
	n.recorder.Eventf(pod, corev1.EventTypeWarning, EventPodNetworkNotServed,
		"the pod's PodNetwork %s (%s) is not served by vpcnid on %s yet: its address is from the node's default network, with that network's subnet and security groups, until the pod is recreated on an agent that serves it",
		network, v1alpha1.AnnotationNetwork, n.name)
}
