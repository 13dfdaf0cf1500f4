package k8s

import corev1 "k8s.io/api/core/v1"

// IPResource is the extended resource a node advertises and a pod on the
// pod network requests: one address. The scheduler then places no pod on
// a node that could not address it, instead of leaving it in
// ContainerCreating with "no free address" events.
const IPResource corev1.ResourceName = "vpcni.io/ip"

// OnPodNetwork says whether the pod takes an address from vpcni.
func OnPodNetwork(pod *corev1.Pod) bool { return !pod.Spec.HostNetwork }

// RequestsIP says whether a container of the pod requests (or limits,
// which for an extended resource is the same) vpcni.io/ip.
func RequestsIP(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if _, ok := c.Resources.Requests[IPResource]; ok {
				return true
			}
			if _, ok := c.Resources.Limits[IPResource]; ok {
				return true
			}
		}
	}
	return false
}
