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
func RequestsIP(pod *corev1.Pod) bool { return Requests(pod, IPResource) }

// NetworkResourcePrefix is the domain of the extended resources that count
// a node's room per PodNetwork: pn.vpcni.io/<name>.
const NetworkResourcePrefix = "pn.vpcni.io/"

// NetworkResource is the extended resource a node advertises for
// PodNetwork name, and a pod on that network requests one of: the
// scheduler then places the pod only on a node that can give it an
// address of its network. ok is false for a name longer than a resource
// name's 63 characters (such a PodNetwork is not counted by the scheduler).
func NetworkResource(name string) (corev1.ResourceName, bool) {
	if name == "" || len(name) > 63 {
		return "", false
	}
	return corev1.ResourceName(NetworkResourcePrefix + name), true
}

// Requests says whether a container of the pod requests (or limits) r.
func Requests(pod *corev1.Pod, r corev1.ResourceName) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if _, ok := c.Resources.Requests[r]; ok {
				return true
			}
			if _, ok := c.Resources.Limits[r]; ok {
				return true
			}
		}
	}
	return false
}
